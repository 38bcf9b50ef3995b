"""A deployment's topics are named after the deployment alone, and each run reuses them: where they exist labelled
with another site, setup refuses before it makes anything (gpuflow.steps.resources.check_deployment_topics)."""

from __future__ import annotations

import pytest

from gpuflow.configuration.loading import load_config
from gpuflow.runs.naming import resource_names
from gpuflow.steps.resources import create_resources, delete_resources, delete_whole_bucket, list_named

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_another_sites_deployment_of_the_same_name_is_refused_and_left_as_it_was(local_config, emulators):
    from gpuflow.platform.emulators import LOCAL_CONN_ID, emulator_environment
    from tests.helpers import local_site_file, site_config

    def site(name: str):
        return load_config(site_config(f"{name}.yaml", local_site_file(), bucket=f"{name}-bucket",
                                       **{"limits.lasting_deployments": True, "deployment.mode": "persistent",
                                          "deployment.name": "shared-name"}))

    first, second = site("topics-a"), site("topics-b")
    theirs, ours = resource_names(first, "gf-5a0a7000b1"), resource_names(second, "gf-5a0a7000b2")
    assert theirs.topics == ours.topics  # the same deployment name, in the same project
    with emulator_environment(local_config):
        create_resources(first, theirs, LOCAL_CONN_ID)
        try:
            before = list_named(first, LOCAL_CONN_ID, ("gfd-shared-name-", "gf-5a0a7000b"))
            with pytest.raises(RuntimeError, match=r"made by another site's DAGs \(gfd-shared-name-\S+: site "
                                                   r"topics-a.*this run's site is topics-b\. Nothing was created\. "
                                                   r"Fix: give this site's deployment a name of its own"):
                create_resources(second, ours, LOCAL_CONN_ID)
            assert list_named(first, LOCAL_CONN_ID, ("gfd-shared-name-", "gf-5a0a7000b")) == before
            # The same site's next run reuses them.
            again = resource_names(first, "gf-5a0a7000b3")
            create_resources(first, again, LOCAL_CONN_ID)
            delete_resources(first, again, LOCAL_CONN_ID)
        finally:
            delete_resources(first, theirs.model_copy(update={"deployment": None}), LOCAL_CONN_ID)
            for bucket in ("topics-a-bucket", "topics-b-bucket"):  # the janitor tests on this emulator list buckets
                delete_whole_bucket(first, LOCAL_CONN_ID, bucket)
