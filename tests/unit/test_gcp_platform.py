"""The gcp platform against faked Google clients: each request is the API's own type, with the expected fields,
and the state sequences the services return lead to the right outcome."""

import pytest
from google.cloud import aiplatform_v1, dataflow_v1beta3
from google.cloud.devtools import cloudbuild_v1

from gpuflow.dataflow.options import job_name_for
from gpuflow.platform import JobHandle
from gpuflow.platform.gcp import GcpPlatform
from gpuflow.runs.naming import resource_names
from gpuflow.steps.gpu import NoGpuOnWorkers, judge_gpu_report
from gpuflow.steps.quota import QuotaTooLow, check_quota
from tests.gcp_fakes import (
    BATCH_SUCCEEDS,
    L4_WORKER_REPORT,
    STREAMING_STARTS,
    FakeDataflow,
    FakeGoogleCloud,
    FakeRegionsClient,
    JobState,
    gcp_test_config,
)
from tests.helpers import GCP_TEST_PROJECT


def platform_with(fake, *overrides):
    """The real GcpPlatform, its clients made by gpuflow's own factory: ``fake`` must be installed."""
    assert fake.installed, "install the fake first: FakeGoogleCloud().install(monkeypatch)"
    return GcpPlatform(gcp_test_config(*overrides))


# -- Vertex AI export ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("overrides", "machine", "disk"), [
    (["model.name=google/flan-t5-small"], "e2-standard-4", 100),
    (["model.name=google/flan-t5-xxl"], "e2-highmem-16", 100),  # guide 002: "> 66 GB", 128 GB machine
    (["model.name=google/flan-ul2"], "e2-highmem-16", 150),
    (["model.name=google/flan-ul2", "export.machine_type=n2-highmem-32", "export.boot_disk_size_gb=300"],
     "n2-highmem-32", 300),
    (["model.name=acme/t5-custom", "model.parameters_m=5000"], "e2-highmem-16", 100),
])
def test_export_job_machine_and_disk_follow_the_guides_table(overrides, machine, disk, monkeypatch):
    platform = platform_with(FakeGoogleCloud().install(monkeypatch), *overrides)
    names = resource_names(platform.config, "gf-0123456789")
    job = platform.custom_job(names, names.gcs_uri("code", "download_model.py"), names.gcs_uri("code", "export.lock"))
    assert isinstance(job, aiplatform_v1.CustomJob)
    (pool,) = job.job_spec.worker_pool_specs
    assert (pool.machine_spec.machine_type, pool.disk_spec.boot_disk_size_gb, pool.replica_count) == (machine, disk, 1)
    script = pool.container_spec.args[0]
    # The export installs its lock, hash-checked, on the image's own torch, and nothing unpinned.
    install, check, run = script.split(" && ")
    assert install == (f"pip install --quiet --no-deps --require-hashes -r "
                       f"/gcs/{names.bucket}/gpuflow/gf-0123456789/code/export.lock")
    assert check == "pip check"
    assert f"/gcs/{names.bucket}/gpuflow/gf-0123456789/code/download_model.py local" in script
    assert f"--state-dict-path=/gcs/{names.bucket}/gpuflow/gf-0123456789/model/state_dict.pth" in script
    assert job.labels["gpuflow-run"] == "gf-0123456789"


# -- Dataflow: stopping, finding (waiting: tests/unit/test_triggers.py) ---------------------------------------------------------


@pytest.mark.parametrize(("action", "script", "requested"), [
    ("cancel", STREAMING_STARTS, "JOB_STATE_CANCELLED"),
    ("drain", STREAMING_STARTS, "JOB_STATE_DRAINED"),
    ("drain", [(JobState.JOB_STATE_PENDING, [])], "JOB_STATE_CANCELLED"),  # a job not yet running cannot drain
])
def test_stop_cancels_or_drains(action, script, requested, monkeypatch, gcp_connection):
    """Through the provider's DataflowHook (the fake sits under its REST client)."""
    fake = FakeGoogleCloud().install(monkeypatch)
    handle = fake.dataflow.scripted_job(script)
    fake.dataflow.jobs[handle.id].step = len(script) - 2  # the next poll sees the script's last state
    assert platform_with(fake, f"dataflow.stop_action={action}").stop_pipeline(handle) is True
    (update,) = fake.dataflow.calls("update_job")
    assert isinstance(update, dataflow_v1beta3.UpdateJobRequest)
    assert (update.job_id, dataflow_v1beta3.JobState(update.job.requested_state).name) == (handle.id, requested)


def test_stop_leaves_a_finished_job_alone(monkeypatch, gcp_connection):
    fake = FakeGoogleCloud().install(monkeypatch)
    handle = fake.dataflow.scripted_job(BATCH_SUCCEEDS)
    fake.dataflow.jobs[handle.id].step = len(BATCH_SUCCEEDS) - 1
    assert platform_with(fake).stop_pipeline(handle) is False
    assert fake.dataflow.calls("update_job") == []


def test_cleanup_finds_the_runs_active_jobs_in_every_region_it_may_have_used(monkeypatch, gcp_connection):
    fake = FakeGoogleCloud().install(monkeypatch)  # listed with the provider's AsyncDataflowHook.list_jobs
    fake.dataflow.scripted_job(STREAMING_STARTS, name="gf-0123456789-llm-inference-us-central1-l4")
    fake.dataflow.scripted_job(STREAMING_STARTS, name="gf-0123456789-gpu-check-us-east4-l4", location="us-east4")
    fake.dataflow.scripted_job(STREAMING_STARTS, name="gf-9999999999-llm-inference-us-central1-l4")  # another run's
    platform = platform_with(fake, "gpu.fallbacks=[{region: us-east4}]")
    found = platform.find_run_jobs(resource_names(platform.config, "gf-0123456789"))
    assert sorted((h.name, h.location) for h in found) == [("gf-0123456789-gpu-check-us-east4-l4", "us-east4"),
                                                           ("gf-0123456789-llm-inference-us-central1-l4", "us-central1")]
    assert [r.location for r in fake.dataflow.calls("list_jobs")] == ["us-central1", "us-east4"]
    assert all(h.url.startswith("https://console.cloud.google.com/dataflow/jobs/") for h in found)


def test_fallback_jobs_get_names_of_their_own():
    config = gcp_test_config("gpu.fallbacks=[{region: us-east4, type: nvidia-tesla-t4, machine_type: n1-standard-8}]")
    from gpuflow.steps.placements import fallback_configs

    names = resource_names(config, "gf-0123456789")
    assert [job_name_for(names, c, "llm-inference") for c in [config, *fallback_configs(config)]] == [
        "gf-0123456789-llm-inference-us-central1-l4", "gf-0123456789-llm-inference-us-east4-t4"]


# -- quota, GPU check ------------------------------------------------------------------------------------------


def test_quota_must_cover_count_times_max_workers(monkeypatch):
    fake = FakeGoogleCloud(regions=FakeRegionsClient({"us-central1": [("NVIDIA_L4_GPUS", 8, 6)]})).install(monkeypatch)
    platform = platform_with(fake, "gpu.count=1", "worker.max_num_workers=3")
    with pytest.raises(QuotaTooLow, match=r"NVIDIA_L4_GPUS quota is 8 with 6 in use, so 2 free, but the job needs 3"):
        check_quota(platform.config, platform)
    platform = platform_with(fake, "worker.max_num_workers=2")
    assert check_quota(platform.config, platform)["enough"] is True


@pytest.mark.parametrize(("report", "fails"), [(L4_WORKER_REPORT, False),
                                               ({**L4_WORKER_REPORT, "gpu_found": False, "errors": [
                                                   "PyTorch failed to detect GPUs with your setup"]}, True)])
def test_on_google_cloud_workers_without_a_gpu_fail_the_check(report, fails):
    config = gcp_test_config("require_gpu=false")
    if fails:
        with pytest.raises(NoGpuOnWorkers, match="PyTorch failed to detect GPUs"):
            judge_gpu_report(config, report)
    else:
        assert judge_gpu_report(config, report)["gpu_found"] is True


# -- Cloud Build ---------------------------------------------------------------------------------------------


def test_an_image_whose_tag_exists_is_not_built_again(tmp_path, monkeypatch):
    fake = FakeGoogleCloud().install(monkeypatch)
    image = f"us-central1-docker.pkg.dev/{GCP_TEST_PROJECT}/gpuflow/l4:3f2a9c0d"
    fake.registry.tags.add(image)
    platform = platform_with(fake)
    result = platform.build_image(tmp_path, image, resource_names(platform.config, "gf-0123456789"))
    assert (result.built, fake.build.requests) == (False, [])
    (lookup,) = fake.registry.requests
    # gpuflow's own factory made the client, with the connection's credentials and the provider's client info
    from airflow.providers.google.common.consts import CLIENT_INFO
    from google.auth.credentials import AnonymousCredentials

    ((made, kwargs),) = fake.clients_made
    assert made == "ArtifactRegistryClient" and kwargs["client_info"] is CLIENT_INFO
    assert isinstance(kwargs["credentials"], AnonymousCredentials)
    assert lookup.name == (f"projects/{GCP_TEST_PROJECT}/locations/us-central1/repositories/gpuflow/packages/l4/"
                           "tags/3f2a9c0d")


def test_the_cloud_build_request(monkeypatch):
    platform = platform_with(FakeGoogleCloud().install(monkeypatch), "container.build_timeout_s=1800")
    from gpuflow.runs.naming import resource_names

    names = resource_names(platform.config, "gf-0123456789")
    build = platform.cloud_build_request("gpuflow/gf-0123456789/build/context.tar.gz", "img:tag", names)
    assert isinstance(build, cloudbuild_v1.Build)
    assert (build.source.storage_source.bucket, build.source.storage_source.object_) == (
        names.bucket, "gpuflow/gf-0123456789/build/context.tar.gz")
    assert "gpuflow-run-gf-0123456789" in build.tags  # builds take tags, not labels
    assert [(s.name, list(s.args)) for s in build.steps] == [
        ("gcr.io/cloud-builders/docker", ["build", "-t", "img:tag", "."])]
    assert list(build.images) == ["img:tag"] and build.timeout.seconds == 1800


# -- on_kill ---------------------------------------------------------------------------------------------------


def test_on_kill_cancels_the_vertex_job_and_the_build(monkeypatch, gcp_connection):
    """Through the provider's CustomJobHook and CloudBuildHook (the fakes sit under them)."""
    from gpuflow.operators.streaming import BuildContainerOperator, ExportModelOperator

    fake = FakeGoogleCloud().install(monkeypatch)
    platform = platform_with(fake)
    job_name = f"projects/{GCP_TEST_PROJECT}/locations/us-central1/customJobs/7"
    export = ExportModelOperator(task_id="export_model")
    export.remember_job(platform, JobHandle(kind="vertex-custom-job", id="7", name=job_name, location="us-central1"))
    export.on_kill()
    build = BuildContainerOperator(task_id="build_container")
    build.remember_job(platform, JobHandle(kind="cloud-build", id="b7e1c0de", name="b7e1c0de", location="us-central1"))
    build.on_kill()
    ((_, cancel_job),) = [r for r in fake.vertex.requests if r[0] == "cancel_custom_job"]
    assert isinstance(cancel_job, aiplatform_v1.CancelCustomJobRequest)
    assert cancel_job.name == f"projects/{GCP_TEST_PROJECT}/locations/us-central1/customJobs/7"
    ((_, cancel_build),) = [r for r in fake.build.requests if r[0] == "cancel_build"]
    assert isinstance(cancel_build, cloudbuild_v1.CancelBuildRequest)
    assert (cancel_build.id, cancel_build.project_id) == ("b7e1c0de", GCP_TEST_PROJECT)


def test_launch_on_kill_cancels_the_dataflow_job(monkeypatch, gcp_connection):
    from gpuflow.operators.streaming import LaunchPipelineOperator

    fake = FakeGoogleCloud(dataflow=FakeDataflow()).install(monkeypatch)
    platform = platform_with(fake)
    operator = LaunchPipelineOperator(task_id="launch")
    handle = fake.dataflow.scripted_job(STREAMING_STARTS)
    operator.remember_job(platform, handle)
    operator.on_kill()
    (update,) = fake.dataflow.calls("update_job")
    assert update.job_id == handle.id


@pytest.mark.parametrize(("drain", "streaming", "passing", "ended"), [
    (True, True, "JOB_STATE_DRAINING", "JOB_STATE_DRAINED"),
    (False, True, "JOB_STATE_CANCELLING", "JOB_STATE_CANCELLED"),
    (True, False, "JOB_STATE_CANCELLING", "JOB_STATE_CANCELLED"),  # a batch job cannot drain: it is cancelled
])
def test_a_stop_passes_through_its_transitional_state(monkeypatch, gcp_connection, drain, streaming, passing, ended):
    fake = FakeGoogleCloud(dataflow=FakeDataflow()).install(monkeypatch)
    platform = platform_with(fake)
    handle = fake.dataflow.scripted_job(STREAMING_STARTS, streaming=streaming)
    for _ in range(3):  # PENDING, then RUNNING with its workers up
        fake.dataflow.get_job(dataflow_v1beta3.GetJobRequest(job_id=handle.id))
    assert platform.request_stop(handle, drain=drain)
    seen = [dataflow_v1beta3.JobState(fake.dataflow.get_job(dataflow_v1beta3.GetJobRequest(job_id=handle.id))
                                      .current_state).name for _ in range(3)]
    assert seen == [passing, ended, ended]
    assert not platform.request_stop(handle, drain=drain)  # already ended: nothing to ask
