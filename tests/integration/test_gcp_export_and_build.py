"""export_model and build_container on the gcp profile: Vertex AI and Cloud Build faked at the client, the
script, the build context and the weights in the GCS emulator."""

import io
import tarfile

import pytest

from gpuflow.config import load_config
from gpuflow.naming import resource_names
from gpuflow.platform.gcp import GcpPlatform
from gpuflow.platform.gcp_build import CloudBuildFailed
from gpuflow.platform.gcp_vertex import VertexJobFailed
from gpuflow.steps.container import build_container
from gpuflow.steps.export import export_model
from tests.gcp_fakes import FakeArtifactRegistry, FakeCloudBuild, FakeGoogleCloud, FakeVertex
from tests.helpers import GCP_TEST_PROJECT, ROOT

BUCKET = "gpuflow-export-test"
OOM = ("The replica workerpool0-0 exited with a non-zero status of 137(SIGKILL). Termination reason: OOMKilled. "
       "To find out more about why your job exited please check the logs: https://console.cloud.google.com/logs/viewer")


@pytest.fixture
def gcs(gcs_bucket):
    return gcs_bucket(BUCKET)


def setup(fake, prefix, *overrides):
    config = load_config("configs/gcp.example.yaml", overrides=[
        f"project={GCP_TEST_PROJECT}", f"bucket={BUCKET}", "model.name=google/flan-t5-small",
        "dataflow.poll_interval_s=0.01", *overrides])
    return config, resource_names(config, prefix), GcpPlatform(config, clients=fake)


def test_export_runs_the_uploaded_script_once_then_skips_the_same_model(gcs, gcp_env, demo_model_dir):
    fake = FakeGoogleCloud(vertex=FakeVertex(gcp_env, demo_model_dir))
    config, names, platform = setup(fake, "gf-export00001")
    first = export_model(config, names, platform)
    uploaded = gcs.download(BUCKET, f"{names.object_prefix}/code/download_model.py").decode()
    assert uploaded == (ROOT / "beam_jobs" / "download_model.py").read_text()
    assert first["skipped"] is False and gcs.exists(BUCKET, f"{names.object_prefix}/model/state_dict.pth")
    assert [n for n, _ in fake.vertex.requests].count("create_custom_job") == 1
    assert [n for n, _ in fake.vertex.requests][-1] == "get_custom_job"  # polled to SUCCEEDED

    second = export_model(config, names, platform)
    assert second["skipped"] is True
    assert [n for n, _ in fake.vertex.requests].count("create_custom_job") == 1

    other_model = setup(fake, "gf-export00001", "model.name=google/flan-t5-base")
    fake.vertex.polls = 0
    assert export_model(*other_model)["skipped"] is False  # another model at the same path is exported again


def test_a_failed_vertex_job_raises_with_its_error(gcs):
    fake = FakeGoogleCloud(vertex=FakeVertex(fail_with=OOM))
    config, names, platform = setup(fake, "gf-export00002")
    with pytest.raises(VertexJobFailed, match="JOB_STATE_FAILED: The replica workerpool0-0 .*OOMKilled.*machine_type"):
        export_model(config, names, platform)


def test_cloud_build_builds_the_rendered_context_once_per_content(gcs, tmp_path):
    fake = FakeGoogleCloud()
    config, names, platform = setup(fake, "gf-build000001")
    built = build_container(config, names, platform, work_dir=tmp_path / "a")
    assert built["built"] is True
    (create,) = [r for n, r in fake.build.requests if n == "create_build"]
    source = create.build.source.storage_source
    with tarfile.open(fileobj=io.BytesIO(gcs.download(source.bucket, source.object_))) as context:
        assert "./Dockerfile" in context.getnames()
    assert create.parent == f"projects/{GCP_TEST_PROJECT}/locations/us-central1"
    assert list(create.build.images) == [built["image"]]

    again = build_container(config, resource_names(config, "gf-build000002"), platform, work_dir=tmp_path / "b")
    assert (again["image"], again["built"]) == (built["image"], False)  # same content, same tag: skipped
    assert len([r for n, r in fake.build.requests if n == "create_build"]) == 1


def test_a_failed_build_raises_with_cloud_builds_detail(gcs, tmp_path):
    registry = FakeArtifactRegistry()
    detail = 'Build step 0 "gcr.io/cloud-builders/docker" failed: step exited with non-zero status: 1'
    fake = FakeGoogleCloud(registry=registry, build=FakeCloudBuild(registry, fail_with=detail))
    config, names, platform = setup(fake, "gf-build000003")
    with pytest.raises(CloudBuildFailed, match="FAILURE: Build step 0 .* read its log at https://"):
        build_container(config, names, platform, work_dir=tmp_path)
