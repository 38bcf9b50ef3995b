"""What the launch task would send to Dataflow, proven offline.

Beam's real DataflowRunner stages the streaming job with ``--template_location`` into the GCS emulator; the
job request it writes there is read back and checked field by field, for an L4 and a T4 configuration.
The launch call that follows goes to the fake Templates service, which checks its API type.
"""

import pytest
from google.cloud import dataflow_v1beta3

from gpuflow.configuration.loading import load_config
from gpuflow.dataflow.constraints import violations
from gpuflow.dataflow.options import job_name_for
from gpuflow.platform.gcp import GcpPlatform
from gpuflow.platform.gcp_dataflow import DataflowJobFailed
from gpuflow.preflight import has_errors, run_preflight
from gpuflow.runs.naming import resource_names
from gpuflow.steps.launch import pipeline_argv
from tests.gcp_fakes import FakeGoogleCloud
from tests.helpers import GCP_TEST_PROJECT

IMAGE = f"us-central1-docker.pkg.dev/{GCP_TEST_PROJECT}/gpuflow/l4:3f2a9c0d1e4b5a6c"
SERVICE_ACCOUNT = f"gpuflow-worker@{GCP_TEST_PROJECT}.iam.gserviceaccount.com"

CASES = {
    "l4": dict(
        overrides=["model.name=google/flan-t5-large", "gpu.machine_type=g2-standard-8"],
        accelerator="worker_accelerator=type:nvidia-l4;count:1;install-nvidia-driver",
        machine="g2-standard-8", disk=50, single_process=False,
    ),
    "t4": dict(
        # flan-t5-xl in float32 (a T4 has no bfloat16) takes most of its 16 GB: one SDK process per worker.
        overrides=["model.name=google/flan-t5-xl", "model.dtype=float32", "gpu.type=nvidia-tesla-t4",
                   "gpu.machine_type=n1-highmem-8", "gpu.count=1", "worker.disk_size_gb=100",
                   "worker.max_num_workers=3"],
        accelerator="worker_accelerator=type:nvidia-tesla-t4;count:1;install-nvidia-driver",
        machine="n1-highmem-8", disk=100, single_process=True,
    ),
}


def gcp_config(*overrides):
    return load_config("configs/gcp.example.yaml", overrides=[
        f"project={GCP_TEST_PROJECT}", "bucket=gpuflow-request-test", f"dataflow.service_account={SERVICE_ACCOUNT}",
        *overrides])


@pytest.fixture
def bucket(gcs_bucket):
    gcs_bucket("gpuflow-request-test")
    return "gpuflow-request-test"


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_staged_streaming_job_request(case, bucket, monkeypatch):
    expected = CASES[case]
    config = gcp_config(*expected["overrides"])
    assert not has_errors(run_preflight(config, check_environment=False))
    names = resource_names(config, f"gf-req{case}0001")
    job_name = job_name_for(names, config, "llm-inference")
    fake = FakeGoogleCloud().install(monkeypatch)  # under the provider's hooks
    platform = GcpPlatform(config)

    template_uri, request = platform.stage_template("llm_inference.py", pipeline_argv(config, names), names, IMAGE,
                                                    job_name, streaming=True)

    environment = request["environment"]
    (pool,) = environment["workerPools"]
    assert request["type"] == "JOB_TYPE_STREAMING"
    assert request["name"] == job_name
    assert environment.get("serviceOptions", []) == ([expected["accelerator"]] if expected["accelerator"] else [])
    assert (pool["machineType"], pool["diskSizeGb"]) == (expected["machine"], expected["disk"])
    assert pool["autoscalingSettings"]["maxNumWorkers"] == config.worker.max_num_workers
    assert pool["workerHarnessContainerImage"] == IMAGE
    assert [image["containerImage"] for image in pool["sdkHarnessContainerImages"]] == [IMAGE]
    assert "use_runner_v2" in environment["experiments"]
    assert ("no_use_multiple_sdk_containers" in environment["experiments"]) is expected["single_process"]
    assert ("use_multiple_sdk_containers" in environment["experiments"]) is not expected["single_process"]
    assert environment["serviceAccountEmail"] == SERVICE_ACCOUNT
    # The SDK that pickled the pipeline runs the container recipe's Python (else: "unknown opcode").
    assert environment["userAgent"]["name"] == f"Apache Beam Python {config.python_version} SDK"
    assert environment["userAgent"]["version"] == config.beam_version
    capabilities = pool["sdkHarnessContainerImages"][0]["capabilities"]
    assert f"beam:version:sdk_base:apache/beam_python{config.python_version}_sdk:{config.beam_version}" in capabilities
    assert environment["sdkPipelineOptions"]["options"]["streaming"] is True

    # Dataflow's documented constraints hold on what Dataflow receives (start_template refuses it otherwise).
    assert violations(platform.staged_request(request)) == []
    handle = platform.start_template(template_uri, request, job_name, names, streaming=True)
    (launch,) = fake.dataflow.calls("launch_template")
    assert isinstance(launch, dataflow_v1beta3.LaunchTemplateRequest)
    assert (launch.project_id, launch.location, launch.gcs_path) == (GCP_TEST_PROJECT, "us-central1", template_uri)
    runtime = launch.launch_parameters.environment
    assert (runtime.machine_type, runtime.disk_size_gb, runtime.max_workers) == (
        expected["machine"], expected["disk"], config.worker.max_num_workers)
    assert runtime.service_account_email == SERVICE_ACCOUNT
    assert runtime.additional_user_labels["gpuflow-run"] == names.prefix
    assert runtime.enable_streaming_engine  # stated: the field's default is false
    assert handle.id == fake.dataflow.jobs[handle.id].id and handle.location == "us-central1"
    job = fake.dataflow.jobs[handle.id]  # what Dataflow makes of the request: a streaming llm_inference job
    assert (job.streaming, job.program) == (True, "llm_inference")


def test_a_container_python_other_than_the_launchers_is_refused_before_launch(bucket, monkeypatch):
    config = gcp_config("model.name=google/flan-t5-large", "python_version=3.12", "launch.mode=direct")
    names = resource_names(config, "gf-reqpy000001")
    fake = FakeGoogleCloud().install(monkeypatch)  # under the provider's hooks
    with pytest.raises(DataflowJobFailed, match="unknown opcode"):
        GcpPlatform(config).launch_pipeline(pipeline_argv(config, names), names, IMAGE)
    assert fake.dataflow.requests == []


def test_an_update_replaces_only_a_running_job_of_that_name(bucket, monkeypatch):
    """Dataflow's update launches a replacement for the running job of the same name, which ends UPDATED; with
    no such job it fails, as Dataflow refuses it."""
    from googleapiclient.errors import HttpError

    from tests.gcp_fakes import FLEX, STREAMING_STARTS

    config = gcp_config("model.name=google/flan-t5-large", *FLEX)  # (no staging: the update request alone)
    names = resource_names(config, "gf-requpd00001")
    fake = FakeGoogleCloud().install(monkeypatch)
    platform = GcpPlatform(config)
    job_name = job_name_for(names, config, "llm-inference")
    with pytest.raises(HttpError) as refused:
        platform.update_pipeline(pipeline_argv(config, names), names, IMAGE, job_name, {})
    assert refused.value.resp.status == 400 and "no running job has that name" in str(refused.value)

    old = fake.dataflow.scripted_job(STREAMING_STARTS, name=job_name)
    state = dataflow_v1beta3.JobState
    assert fake.dataflow.get_job(dataflow_v1beta3.GetJobRequest(job_id=old.id)).current_state == state.JOB_STATE_PENDING
    new = platform.update_pipeline(pipeline_argv(config, names), names, IMAGE, job_name, {"Validate": "Check"})
    assert new.id != old.id and new.name == job_name
    assert fake.dataflow.get_job(dataflow_v1beta3.GetJobRequest(job_id=old.id)).current_state == state.JOB_STATE_UPDATED
    assert [job.name for job in fake.dataflow.list_jobs(dataflow_v1beta3.ListJobsRequest(
        location="us-central1", filter=dataflow_v1beta3.ListJobsRequest.Filter.ACTIVE))] == [job_name]
