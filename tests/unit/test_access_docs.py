"""docs/gcp.md opens with the project's needs, generated from the catalog preflight checks them with."""

from gpuflow.access_docs import GCP_PAGE, page_with_needs, project_needs_markdown
from gpuflow.catalog import access_needs


def test_the_gcp_page_is_current():
    """Regenerate with `gpuflow config-reference --write`."""
    assert GCP_PAGE.read_text() == page_with_needs(GCP_PAGE.read_text())


def test_every_need_role_and_api_is_on_the_page():
    text = project_needs_markdown()
    for need in access_needs().values():
        assert f"`{need.name}`" in text
        assert all(api in text for api in need.apis)
        assert all(f"`{role}`" in text for role in need.permissions.values())
