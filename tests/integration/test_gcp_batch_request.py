"""What run_batch would send to Dataflow for the batch job, proven offline: Beam's real DataflowRunner stages it
(``--template_location`` into the GCS emulator), and the request and pipeline proto it wrote are read back.

- worker_accelerator: every worker gets the GPU; a batch job (no streaming, no Streaming Engine).
- resource_hint: right fitting, supported for batch pipelines (docs.cloud.google.com/dataflow/docs/guides/right-fitting,
  "Support and limitations"): the accelerator hint, with the GPU's machine type inside it, on RunInference's
  environment alone; Dataflow Prime; no worker_accelerator.
- gpu.type none: CPU workers of guide 002's n2-highmem table, no accelerator at all.
"""

import pytest
from google.cloud import dataflow_v1beta3

from gpuflow.configuration.loading import load_config
from gpuflow.dataflow.options import job_name_for
from gpuflow.platform.gcp import GcpPlatform
from gpuflow.preflight import has_errors, run_preflight
from gpuflow.runs.batch_templates import fill_batch_paths
from gpuflow.runs.naming import resource_names
from gpuflow.steps.launch import pipeline_argv
from tests.gcp_fakes import FakeGoogleCloud, file_patterns
from tests.helpers import GCP_TEST_PROJECT

BUCKET = "gpuflow-batch-request-test"
IMAGE = f"us-central1-docker.pkg.dev/{GCP_TEST_PROJECT}/gpuflow/l4:7a1b2c3d4e5f6a7b"
ACCELERATOR_HINT = "beam:resources:accelerator:v1"
ACCELERATOR = "worker_accelerator=type:nvidia-l4;count:1;install-nvidia-driver"

CASES = {
    "worker_accelerator": ([], [ACCELERATOR], "g2-standard-8", None),
    # Right fitting without Prime; the steps without the hint on guide 002's CPU machine for flan-t5-large.
    "resource_hint": (["gpu.request=resource_hint"], [], "n2-highmem-4",
                      b"type:nvidia-l4;count:1;machine_type:g2-standard-8;install-nvidia-driver"),
    "cpu_workers": (["gpu.type=none", "gpu.machine_type=n2-highmem-4", "require_gpu=false"], [], "n2-highmem-4",
                    None),
    # inference.engine vllm: Beam's vLLM handler, keyed by prompt id, in the vllm recipe's image
    "vllm": (["model.name=meta-llama/Llama-3.1-8B", "inference.engine=vllm", "container.recipe=vllm"],
             [ACCELERATOR], "g2-standard-8", None),
}
VLLM_IMAGE = f"us-central1-docker.pkg.dev/{GCP_TEST_PROJECT}/gpuflow/vllm:0c1d2e3f4a5b6c7d"


@pytest.fixture
def gcs(gcs_bucket):
    hook = gcs_bucket(BUCKET)
    # Beam's text source checks at staging that the glob matches (wait_for_input has made sure it does)
    hook.upload(BUCKET, "prompts/2026-03-01/part-0.jsonl", data='{"id": "1", "prompt": "why is the sky blue"}\n')
    return hook


def batch_config(*overrides):
    config = load_config("configs/gcp.example.yaml", overrides=[
        f"project={GCP_TEST_PROJECT}", f"bucket={BUCKET}", "model.name=google/flan-t5-large",
        "gpu.machine_type=g2-standard-8", "worker.max_num_workers=1", *overrides])
    return fill_batch_paths(config, {"ds": "2026-03-01"})


def staged_pipeline(gcs, request):
    """The pipeline proto Beam staged with the request."""
    from apache_beam.portability.api import beam_runner_api_pb2

    pipeline_url = request["environment"]["sdkPipelineOptions"]["options"]["pipelineUrl"]
    bucket, _, blob = pipeline_url.removeprefix("gs://").partition("/")
    return beam_runner_api_pb2.Pipeline.FromString(gcs.download(bucket, blob))


def accelerator_hints(pipeline) -> dict[str, bytes]:
    """Each transform's accelerator hint (Beam carries hints on the environment a transform runs in)."""
    environments = pipeline.components.environments
    return {t.unique_name: environments[t.environment_id].resource_hints.get(ACCELERATOR_HINT, b"")
            for t in pipeline.components.transforms.values() if t.environment_id}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_staged_batch_job_request(case, gcs, monkeypatch):
    overrides, service_options, machine, hint = CASES[case]
    config = batch_config(*overrides)
    # Right fitting with one worker is refused for streaming only: a batch job takes it as it is.
    assert not has_errors(run_preflight(config, check_environment=False, workflow="batch"))
    names = resource_names(config, f"gf-batch{sorted(CASES).index(case)}01")
    fake = FakeGoogleCloud().install(monkeypatch)  # under the provider's hooks
    platform = GcpPlatform(config)
    argv = pipeline_argv(config, names, batch=True)
    job_name = job_name_for(names, config, "llm-batch")
    image = VLLM_IMAGE if case == "vllm" else IMAGE

    template_uri, request = platform.stage_template("llm_inference.py", argv, names, image, job_name,
                                                    streaming=False)

    environment = request["environment"]
    (pool,) = environment["workerPools"]
    options = environment["sdkPipelineOptions"]["options"]
    assert request["type"] == "JOB_TYPE_BATCH" and request["name"] == job_name
    assert environment.get("serviceOptions", []) == service_options
    assert pool["machineType"] == machine
    assert "use_runner_v2" in environment["experiments"]
    assert "enable_streaming_engine" not in environment["experiments"] and not options.get("streaming")
    assert "enable_streaming_rightfitting" not in environment["experiments"]  # a batch job needs no experiment
    assert {harness["containerImage"] for harness in pool["sdkHarnessContainerImages"]} == {image}
    pipeline = staged_pipeline(gcs, request)
    names_of_steps = {t.unique_name.split("/")[0] for t in pipeline.components.transforms.values()}
    assert ("ToKeyedText" in names_of_steps) is (case == "vllm")  # vLLM gets each prompt's text, keyed by its id
    # The interval's input, and the run's staging folders (publish moves them into place).
    staging = f"_gpuflow-staging-{names.prefix}-2026-03-01"
    assert file_patterns(pipeline) == {
        "ReadPrompts": f"gs://{BUCKET}/prompts/2026-03-01/*.jsonl",
        "WriteAnswers": f"gs://{BUCKET}/answers/{staging}/responses.jsonl",
        "WriteDeadLetters": f"gs://{BUCKET}/dead_letters/{staging}/dead_letters.jsonl",
        "WriteSummary": f"gs://{BUCKET}/answers/{staging}/summary.json",
    }

    hints = accelerator_hints(pipeline)
    hinted = {name.split("/")[0] for name, value in hints.items() if value}
    if hint is None:
        assert hinted == set()
    else:
        assert hinted == {"RunInference"}
        assert {value for value in hints.values() if value} == {hint}
        assert {"ParseLines", "Validate", "WriteAnswers", "WriteDeadLetters", "WriteSummary"} <= {
            name.split("/")[0] for name, value in hints.items() if not value}

    handle = platform.start_template(template_uri, request, job_name, names, streaming=False)
    (launch,) = fake.dataflow.calls("launch_template")
    assert isinstance(launch, dataflow_v1beta3.LaunchTemplateRequest) and launch.gcs_path == template_uri
    assert launch.launch_parameters.environment.machine_type == machine
    assert handle.name == job_name and "-llm-batch-" in job_name


def test_a_batch_request_launched_as_the_streaming_job_fails_its_wait(gcs, monkeypatch):
    """The fake answers from the request: the staged job's type says batch, whatever its name says, and the
    streaming launch's wait refuses a job that would end instead of serving."""
    from gpuflow.triggers import job_trigger
    from tests.helpers import first_event

    config = batch_config("dataflow.poll_interval_s=0.01")
    names = resource_names(config, "gf-reqwrong001")
    fake = FakeGoogleCloud().install(monkeypatch)
    platform = GcpPlatform(config)
    streaming_name = job_name_for(names, config, "llm-inference")
    template_uri, request = platform.stage_template("llm_inference.py", pipeline_argv(config, names, batch=True),
                                                    names, IMAGE, streaming_name, streaming=False)
    assert request["type"] == "JOB_TYPE_BATCH"
    handle = platform.start_template(template_uri, request, streaming_name, names, streaming=False)
    job = fake.dataflow.jobs[handle.id]
    assert (job.streaming, job.program) == (False, "llm_inference")  # read from the staged job and its pipeline
    event = first_event(job_trigger(config, handle, "running", 60))
    assert event["status"] == "failed" and "runs as a batch job" in event["message"]
