"""export_model and build_container on the gcp profile: the provider's CustomJobHook and CloudBuildHook start the
jobs, and their triggers wait for them, with Vertex AI and Cloud Build faked under the hooks; the script, the build
context and the weights are in the GCS emulator."""

import io
import tarfile

import pytest

from gpuflow.configuration.loading import load_config
from gpuflow.platform import JobHandle
from gpuflow.platform.gcp import GcpPlatform
from gpuflow.runs.naming import resource_names
from gpuflow.steps.container import build_container
from gpuflow.steps.export import export_model
from gpuflow.triggers import job_trigger
from tests.gcp_fakes import FakeGoogleCloud, FakeVertex
from tests.helpers import GCP_TEST_PROJECT, ROOT, first_event

BUCKET = "gpuflow-export-test"
OOM = ("The replica workerpool0-0 exited with a non-zero status of 137(SIGKILL). Termination reason: OOMKilled. "
       "To find out more about why your job exited please check the logs: https://console.cloud.google.com/logs/viewer")


@pytest.fixture
def gcs(gcs_bucket):
    return gcs_bucket(BUCKET)


def setup(fake, monkeypatch, prefix, *overrides):
    fake.install(monkeypatch)
    config = load_config("configs/gcp.example.yaml", overrides=[
        f"project={GCP_TEST_PROJECT}", f"bucket={BUCKET}", "model.name=google/flan-t5-small",
        "dataflow.poll_interval_s=0.01", *overrides])
    return config, resource_names(config, prefix), GcpPlatform(config)


def wait_for(config, job) -> dict:
    return first_event(job_trigger(config, JobHandle.model_validate(job), "done", 60))


def test_a_retried_export_waits_on_the_custom_job_its_first_try_started(gcs, monkeypatch):
    """export_model at a retry finds the earlier try's custom job by its name (Vertex AI's list filter) and label,
    still running, and hands its handle back to wait on; once that job has failed, a try starts its own."""
    fake = FakeGoogleCloud(vertex=FakeVertex(running_polls=3))  # the job runs on (nothing written yet)
    config, names, platform = setup(fake, monkeypatch, "gf-export00003")
    first = export_model(config, names, platform)
    retry = export_model(config, names, platform)
    assert retry["job"] == first["job"] and retry["skipped"] is False
    def creates() -> int:
        return [n for n, _ in fake.vertex.requests].count("create_custom_job")

    assert creates() == 1
    listed = [r for n, r in fake.vertex.requests if n == "list_custom_jobs"][-1]
    assert (listed.parent, listed.filter) == (f"projects/{GCP_TEST_PROJECT}/locations/us-central1",
                                              f'display_name="{names.prefix}-export"')
    fake.vertex.fail_with, fake.vertex.polls = "OOMKilled", 3  # the job has failed since
    assert export_model(config, names, platform)["job"] is not None and creates() == 2


def test_export_runs_the_uploaded_script_once_then_skips_the_same_model(gcs, gcp_env, demo_model_dir, monkeypatch):
    fake = FakeGoogleCloud(vertex=FakeVertex(gcp_env, demo_model_dir))
    config, names, platform = setup(fake, monkeypatch, "gf-export00001")
    first = export_model(config, names, platform)
    uploaded = gcs.download(BUCKET, f"{names.object_prefix}/code/download_model.py").decode()
    assert uploaded == (ROOT / "beam_jobs" / "download_model.py").read_text()
    lock = gcs.download(BUCKET, f"{names.object_prefix}/code/export.lock").decode()
    assert lock == (ROOT / "docker" / "locks" / "export.lock").read_text()  # what the job's pip installs
    assert first["skipped"] is False and first["job"]["kind"] == "vertex-custom-job"
    (create,) = [r for n, r in fake.vertex.requests if n == "create_custom_job"]
    assert create.parent == f"projects/{GCP_TEST_PROJECT}/locations/us-central1"  # the hook's own request
    # Always an account gpuflow names: the workers' (here Compute Engine's default), never Vertex AI's service agent
    from tests.gcp_fakes.access import COMPUTE_DEFAULT_ACCOUNT

    assert create.custom_job.job_spec.service_account == COMPUTE_DEFAULT_ACCOUNT
    assert wait_for(config, first["job"])["status"] == "success"  # the provider's trigger polled it to SUCCEEDED
    assert gcs.exists(BUCKET, f"{names.object_prefix}/model/state_dict.pth")

    second = export_model(config, names, platform)
    assert second["skipped"] is True and "job" not in second
    assert [n for n, _ in fake.vertex.requests].count("create_custom_job") == 1

    other_model = setup(fake, monkeypatch, "gf-export00001", "model.name=google/flan-t5-base")
    assert export_model(*other_model)["skipped"] is False  # another model at the same path is exported again


def test_a_failed_vertex_job_ends_with_its_error(gcs, monkeypatch):
    fake = FakeGoogleCloud(vertex=FakeVertex(fail_with=OOM))
    config, names, platform = setup(fake, monkeypatch, "gf-export00002")
    event = wait_for(config, export_model(config, names, platform)["job"])
    assert event["status"] == "error" and "OOMKilled" in event["message"]


def test_cloud_build_builds_the_rendered_context_once_per_content(gcs, tmp_path, monkeypatch):
    fake = FakeGoogleCloud()
    config, names, platform = setup(fake, monkeypatch, "gf-build000001")
    started = build_container(config, names, platform, work_dir=tmp_path / "a")
    assert started["built"] is False and started["job"]["kind"] == "cloud-build"
    (create,) = [r for n, r in fake.build.requests if n == "create_build"]
    source = create.build.source.storage_source
    with tarfile.open(fileobj=io.BytesIO(gcs.download(source.bucket, source.object_))) as context:
        assert "./Dockerfile" in context.getnames()
    assert create.parent == f"projects/{GCP_TEST_PROJECT}/locations/us-central1"
    assert list(create.build.images) == [started["image"]]
    assert wait_for(config, started["job"])["status"] == "success"

    again = build_container(config, resource_names(config, "gf-build000002"), platform, work_dir=tmp_path / "b")
    assert (again["image"], again["built"], again["job"]) == (started["image"], False, None)  # same tag: skipped
    assert len([r for n, r in fake.build.requests if n == "create_build"]) == 1


def test_a_retried_build_waits_on_the_build_its_first_try_started(gcs, tmp_path, monkeypatch):
    """build_container at a retry finds the earlier try's Cloud Build by the run's tag, still working, among the
    region's newest builds; another run's build is not its own."""
    fake = FakeGoogleCloud()
    config, names, platform = setup(fake, monkeypatch, "gf-build000003")
    started = build_container(config, names, platform, work_dir=tmp_path / "a")
    retry = build_container(config, names, platform, work_dir=tmp_path / "b")
    assert retry["job"] == started["job"] and retry["image"] == started["image"]
    assert len([r for n, r in fake.build.requests if n == "create_build"]) == 1
    listed = [r for n, r in fake.build.requests if n == "list_builds"][-1]
    assert listed.parent == f"projects/{GCP_TEST_PROJECT}/locations/us-central1" and listed.page_size == 50
    other = build_container(config, resource_names(config, "gf-build000004"), platform, work_dir=tmp_path / "c")
    assert len([r for n, r in fake.build.requests if n == "create_build"]) == 2 and other["job"] is not None
