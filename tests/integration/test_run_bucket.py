"""A run's own bucket (no bucket configured) is named from the DAG and run ids, which a scheduled run makes known in
advance. One that already exists is the run's only when its gpuflow-run label is the run's and (gcp) its project is
the configured one: otherwise setup refuses before writing anything, and cleanup leaves it as it was."""

from __future__ import annotations

import pytest

from gpuflow.configuration.loading import load_config
from gpuflow.runs.naming import resource_names
from gpuflow.steps.resources import create_resources, delete_resources, delete_whole_bucket, list_run_resources

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def squat(gcs, names, project: str, labels: dict[str, str]) -> None:
    """Someone else's bucket of the run's name, with ``labels`` (set with a PATCH: the GCS emulator drops an insert's
    labels), holding a file of theirs."""
    gcs.create_bucket(bucket_name=names.bucket, project_id=project)
    bucket = gcs.get_conn().bucket(names.bucket)
    bucket.labels = labels
    bucket.patch()
    assert gcs.get_conn().get_bucket(names.bucket).labels == labels
    gcs.upload(names.bucket, "theirs.txt", data="not gpuflow's")


def test_a_bucket_with_another_runs_label_is_refused_at_setup_and_left_as_it_was(local_config, emulators):
    from airflow.providers.google.cloud.hooks.gcs import GCSHook

    from gpuflow.platform.emulators import LOCAL_CONN_ID, emulator_environment

    names = resource_names(local_config, "gf-5a0a7000a1")
    assert names.bucket_is_run_scoped
    with emulator_environment(local_config):
        gcs = GCSHook(gcp_conn_id=LOCAL_CONN_ID)
        squat(gcs, names, local_config.project, {"gpuflow-run": "gf-0ther0000"})
        with pytest.raises(RuntimeError, match=r"exists but is not this run's: its gpuflow-run label is "
                                               r"'gf-0ther0000'.*Nothing was written.*Fix: set bucket"):
            create_resources(local_config, names, LOCAL_CONN_ID, lease=("llm_streaming_inference", "scheduled__x"))
        assert gcs.list(names.bucket) == ["theirs.txt"]  # no lease, no object
        assert list_run_resources(local_config, names, LOCAL_CONN_ID)["topics"] == []
        delete_resources(local_config, names, LOCAL_CONN_ID)  # the run's cleanup: it is not the run's to delete
        assert gcs.list(names.bucket) == ["theirs.txt"]
        # The fix the message names: a bucket of the team's own; the run then works in a prefix of it.
        fixed = load_config(local_site_file_with_bucket())
        made = create_resources(fixed, resource_names(fixed, names.prefix), LOCAL_CONN_ID)
        assert made["bucket"] == "team-bucket"
        delete_resources(fixed, resource_names(fixed, names.prefix), LOCAL_CONN_ID)
        for bucket in (names.bucket, "team-bucket"):  # the janitor tests on this emulator would find them
            delete_whole_bucket(local_config, LOCAL_CONN_ID, bucket)


def local_site_file_with_bucket() -> str:
    from tests.helpers import local_site_file, site_config

    return site_config("team-bucket.yaml", local_site_file(), bucket="team-bucket")


def test_a_bucket_of_another_project_is_refused_even_with_the_runs_label(gcp_env, monkeypatch):
    """gcp: the squatter copied the label, but the bucket's project number is not the configured project's."""
    from airflow.providers.google.cloud.hooks.gcs import GCSHook

    from tests.gcp_fakes import FakeGoogleCloud
    from tests.gcp_fakes.access import PROJECT_NUMBER
    from tests.helpers import GCP_TEST_PROJECT

    FakeGoogleCloud().install(monkeypatch)  # Resource Manager: the configured project's number
    config = load_config("configs/gcp.example.yaml", overrides=[f"project={GCP_TEST_PROJECT}", "bucket="])
    names = resource_names(config, "gf-5a0a7000b2")
    gcs = GCSHook(gcp_conn_id=config.gcp_conn_id)
    squat(gcs, names, "someone-elses-project", dict(names.labels))
    emulator_number = gcs.get_conn().get_bucket(names.bucket).project_number
    assert emulator_number is not None and str(emulator_number) != PROJECT_NUMBER
    with pytest.raises(RuntimeError, match=rf"belongs to project number {emulator_number}, not {GCP_TEST_PROJECT} "
                                           rf"\({PROJECT_NUMBER}\)"):
        create_resources(config, names, config.gcp_conn_id, pubsub=False)
    delete_resources(config, names, config.gcp_conn_id, pubsub=False)
    assert gcs.list(names.bucket) == ["theirs.txt"]
    delete_whole_bucket(config, config.gcp_conn_id, names.bucket)  # the janitor tests on this emulator would find it
