"""What each GPU mode sends to Dataflow, proven offline with Beam's own staging and the API's own types.

- resource_hint: the staged pipeline proto carries the accelerator hint on the RunInference step alone, and the
  job request asks for neither Dataflow Prime nor worker_accelerator; the other steps run on a CPU machine.
- flex_template: the template file and the LaunchFlexTemplateRequest; and the launcher's command line
  (flex_main.py with the parameters as --name=value) stages a real job request from those parameters.
"""

import json
import subprocess
import sys

import pytest
from google.cloud import dataflow_v1beta3

from gpuflow.configuration.loading import load_config
from gpuflow.dataflow.constraints import violations
from gpuflow.dataflow.options import flex_parameters, job_name_for
from gpuflow.platform.gcp import GcpPlatform
from gpuflow.runs.naming import resource_names
from gpuflow.steps.launch import pipeline_argv
from tests.gcp_fakes import FLEX, FakeGoogleCloud
from tests.helpers import GCP_TEST_PROJECT, ROOT

BUCKET = "gpuflow-modes-test"
IMAGE = f"us-central1-docker.pkg.dev/{GCP_TEST_PROJECT}/gpuflow/l4:5e1f00d2c3b4a596"
ACCELERATOR_HINT = "beam:resources:accelerator:v1"


@pytest.fixture
def gcs(gcs_bucket):
    return gcs_bucket(BUCKET)


def gcp_config(*overrides):
    return load_config("configs/gcp.example.yaml", overrides=[
        f"project={GCP_TEST_PROJECT}", f"bucket={BUCKET}", "model.name=google/flan-t5-large", *overrides])


def test_right_fitting_puts_the_accelerator_hint_on_runinference_alone(gcs, monkeypatch):
    from apache_beam.portability.api import beam_runner_api_pb2

    # Streaming right fitting (horizontal autoscaling: 2 workers) with model copies shared across processes.
    config = gcp_config("gpu.request=resource_hint", "gpu.sharing=model_copies", "gpu.model_copies=2",
                        "worker.max_num_workers=2")
    names = resource_names(config, "gf-modehint01")
    FakeGoogleCloud().install(monkeypatch)
    platform = GcpPlatform(config)
    _, request = platform.stage_template("llm_inference.py", pipeline_argv(config, names), names, IMAGE,
                                         job_name_for(names, config, "llm-inference"), streaming=True)
    assert violations(platform.staged_request(request)) == []  # Dataflow's constraints, as the launch checks them
    environment = request["environment"]
    # Right fitting without Prime and never with worker_accelerator: the GPU is asked for in the hint alone.
    assert not environment.get("serviceOptions")
    # The steps without the hint run on guide 002's CPU machine for flan-t5-large; streaming right fitting's experiment.
    (pool,) = environment["workerPools"]
    assert pool["machineType"] == "n2-highmem-4"
    assert "enable_streaming_rightfitting" in environment["experiments"]
    assert "enable_streaming_engine" in environment["experiments"]

    pipeline_url = environment["sdkPipelineOptions"]["options"]["pipelineUrl"]
    bucket, _, blob = pipeline_url.removeprefix("gs://").partition("/")
    pipeline = beam_runner_api_pb2.Pipeline.FromString(gcs.download(bucket, blob))
    # Beam carries resource hints on the environment its transforms run in.
    environments = pipeline.components.environments
    transforms = [t for t in pipeline.components.transforms.values() if t.environment_id]

    def hint(transform):
        return environments[transform.environment_id].resource_hints.get(ACCELERATOR_HINT)

    hinted = sorted(t.unique_name for t in transforms if hint(t))
    assert hinted and all(name.split("/")[0] == "RunInference" for name in hinted), hinted
    assert {hint(t) for t in transforms if hint(t)} == {
        b"type:nvidia-l4;count:1;machine_type:g2-standard-8;install-nvidia-driver"}
    unhinted = {t.unique_name.split("/")[0] for t in transforms if not hint(t)}
    assert {"ToRecord", "Validate", "AnswerMessages", "DeadLetterMessages"} <= unhinted, unhinted


def test_flex_template_launch_request_and_template_file(gcs, monkeypatch):
    config = gcp_config(*FLEX, "gpu.sharing=mps", "gpu.machine_type=g2-standard-8",
                        "dataflow.service_account=sa@gpuflow-gcp-test.iam.gserviceaccount.com")
    names = resource_names(config, "gf-modeflex01")
    fake = FakeGoogleCloud().install(monkeypatch)  # under the provider's hooks
    handle = GcpPlatform(config).launch_pipeline(pipeline_argv(config, names), names, IMAGE)

    (request,) = fake.dataflow.calls("launch_flex_template")
    assert isinstance(request, dataflow_v1beta3.LaunchFlexTemplateRequest)
    assert (request.project_id, request.location) == (GCP_TEST_PROJECT, "us-central1")
    parameter = request.launch_parameter
    assert parameter.job_name == handle.name == f"{names.prefix}-llm-inference-us-central1-l4"
    assert parameter.parameters["gpuflow_job"] == "llm_inference"
    assert parameter.parameters["dataflow_service_options"] == (
        "worker_accelerator=type:nvidia-l4;count:1;install-nvidia-driver;use_nvidia_mps")
    environment = parameter.environment
    assert (environment.sdk_container_image, environment.machine_type, environment.disk_size_gb) == (
        IMAGE, "g2-standard-8", 50)
    assert environment.service_account_email == "sa@gpuflow-gcp-test.iam.gserviceaccount.com"
    assert "use_runner_v2" in environment.additional_experiments
    assert "no_use_multiple_sdk_containers" not in environment.additional_experiments  # MPS shares the GPU instead

    spec_uri = parameter.container_spec_gcs_path
    spec = json.loads(gcs.download(BUCKET, spec_uri.removeprefix(f"gs://{BUCKET}/")))
    assert spec["image"] == IMAGE and spec["sdkInfo"] == {"language": "PYTHON"}
    assert {p["name"] for p in spec["metadata"]["parameters"]} == set(parameter.parameters)
    assert fake.dataflow.calls("launch_template") == []  # nothing staged from Airflow's own Beam


def test_the_flex_launchers_command_line_stages_the_job(gcs, gcp_env, monkeypatch):
    """flex_main.py, called as the launcher calls it (every parameter as --name=value, plus the runner's
    options), stages the same streaming job request."""
    config = gcp_config(*FLEX)
    names = resource_names(config, "gf-modeflex02")
    parameters = flex_parameters("llm_inference", pipeline_argv(config, names), config)
    template_uri = names.gcs_uri("templates", "launcher-check.json")
    command = [sys.executable, str(ROOT / "beam_jobs" / "flex_main.py"),
               *(f"--{name}={value}" for name, value in parameters.items()),
               "--runner=DataflowRunner", f"--project={GCP_TEST_PROJECT}", "--region=us-central1",
               f"--temp_location={names.gcs_uri('tmp')}", f"--staging_location={names.gcs_uri('staging')}",
               f"--sdk_container_image={IMAGE}", "--sdk_location=container", f"--template_location={template_uri}"]
    subprocess.run(command, env=gcp_env, check=True, capture_output=True, timeout=600)
    request = json.loads(gcs.download(BUCKET, template_uri.removeprefix(f"gs://{BUCKET}/")))
    assert request["type"] == "JOB_TYPE_STREAMING"
    assert request["environment"]["serviceOptions"] == ["worker_accelerator=type:nvidia-l4;count:1;install-nvidia-driver"]
