"""docs/gcp.md's project needs, generated from the catalog preflight checks them with."""

from gpuflow.catalog import access_needs
from gpuflow.tools.access_docs import project_needs_markdown


def test_every_need_role_and_api_is_on_the_page():
    text = project_needs_markdown()
    for need in access_needs().values():
        assert f"`{need.name}`" in text
        assert all(api in text for api in need.apis)
        assert all(f"`{role}`" in text for role in need.permissions.values())
