"""Every way the guides ask for, share and watch a GPU: what each mode sends, and the GPU usage check."""

import os
import subprocess

import pytest
from google.cloud import monitoring_v3

from gpuflow.configuration.loading import load_config
from gpuflow.dataflow.options import dataflow_options, experiments, flex_parameters, service_options
from gpuflow.platform import JobHandle
from gpuflow.platform.gcp import GcpPlatform
from gpuflow.platform.local import LocalPlatform
from gpuflow.runs.naming import resource_names
from gpuflow.steps.launch import pipeline_argv
from gpuflow.steps.smoke import NoGpuUsage, check_gpu_usage
from tests.gcp_fakes import DIRECT, FLEX, FakeGoogleCloud, FakeMonitoring, gcp_test_config
from tests.helpers import GCP_TEST_PROJECT, first_event

L4 = "type:nvidia-l4;count:1;install-nvidia-driver"


def options_of(config):
    names = resource_names(config, "gf-0123456789")
    return dataflow_options(config, names, "img:1", "job", True, None), pipeline_argv(config, names)


def test_worker_accelerator_is_the_default_request():
    options, argv = options_of(gcp_test_config())
    assert f"--dataflow_service_options=worker_accelerator={L4}" in options
    assert "--accelerator-hint" not in argv and "--dataflow_service_options=enable_prime" not in options


def test_resource_hint_asks_on_the_inference_step_without_prime_and_never_sends_worker_accelerator():
    options, argv = options_of(gcp_test_config("gpu.request=resource_hint", "model.name=google/flan-t5-xl"))
    # The right-fitting page's syntax: the GPU's machine type inside the hint, and only there.
    assert argv[argv.index("--accelerator-hint") + 1] == "type:nvidia-l4;count:1;machine_type:g2-standard-8;" \
                                                        "install-nvidia-driver"
    # The steps without the hint run on guide 002's CPU machine for flan-t5-xl, never on the G2 machine.
    assert [o for o in options if o.startswith("--machine_type")] == ["--machine_type=n2-highmem-4"]
    # Right fitting needs no Prime; a streaming job turns it on with the experiment, on Streaming Engine.
    assert not [o for o in options if "enable_prime" in o or "worker_accelerator" in o]
    assert "--experiments=enable_streaming_rightfitting" in options and "--enable_streaming_engine" in options


def test_resource_hint_pipeline_machine_type_is_its_own_key_and_absent_with_prime():
    options, _ = options_of(gcp_test_config("gpu.request=resource_hint", "worker.machine_type=n2-standard-4"))
    assert [o for o in options if o.startswith("--machine_type")] == ["--machine_type=n2-standard-4"]
    # Dataflow Prime does not support --machine_type for Python pipelines: with Prime asked for, none is sent.
    options, argv = options_of(gcp_test_config("gpu.request=resource_hint", "dataflow_service_options=[enable_prime]"))
    assert not [o for o in options if o.startswith("--machine_type")]
    assert "--dataflow_service_options=enable_prime" in options and "machine_type:g2-standard-8" in " ".join(argv)


def test_a_batch_job_with_the_hint_gets_no_streaming_experiment():
    config = gcp_test_config("gpu.request=resource_hint")
    assert "enable_streaming_rightfitting" not in experiments(config, streaming=False)
    assert "enable_streaming_rightfitting" in experiments(config, streaming=True)


@pytest.mark.parametrize(("overrides", "single_process"), [
    (["model.name=google/flan-t5-large"], False),                  # 16% of an L4: Dataflow's default
    (["model.name=google/flan-t5-xxl", "gpu.type=nvidia-tesla-a100", "gpu.machine_type=a2-highgpu-1g"], True),
    (["model.name=google/flan-t5-large", "gpu.sharing=single_process"], True),
    (["model.name=google/flan-t5-xxl", "gpu.type=nvidia-tesla-a100", "gpu.machine_type=a2-highgpu-1g",
      "gpu.sharing=mps"], False),
])
def test_sharing_decides_the_single_process_experiment(overrides, single_process):
    config = gcp_test_config(*overrides)
    assert ("no_use_multiple_sdk_containers" in experiments(config, streaming=True)) is single_process


def test_mps_rides_on_worker_accelerator():
    config = gcp_test_config("gpu.sharing=mps", "gpu.machine_type=g2-standard-8")
    assert service_options(config) == [f"worker_accelerator={L4};use_nvidia_mps"]


def test_model_copies_reach_runinference():
    _, argv = options_of(gcp_test_config("gpu.sharing=model_copies", "gpu.model_copies=2"))
    assert argv[argv.index("--model-copies") + 1] == "2"


def test_the_handler_shares_its_copies_across_processes():
    import llm_handlers

    handler = llm_handlers.GenerateHandler("m", "m/state_dict.pth", model_copies=2)
    assert (handler.share_model_across_processes(), handler.model_copies()) == (True, 2)
    plain = llm_handlers.GenerateHandler("m", "m/state_dict.pth")
    assert (plain.share_model_across_processes(), plain.model_copies()) == (False, 1)


def test_flex_template_parameters_are_the_jobs_arguments_with_underscores():
    config = gcp_test_config("gpu.sharing=model_copies", "gpu.model_copies=2")
    names = resource_names(config, "gf-0123456789")
    parameters = flex_parameters("llm_inference", pipeline_argv(config, names), config)
    assert parameters["gpuflow_job"] == "llm_inference"
    assert parameters["model_name"] == names.model_dir_uri
    assert parameters["max_new_tokens"] == "64" and parameters["model_copies"] == "2"
    assert parameters["require_gpu"] == "true" and parameters["group_by_length"] == "true"
    assert parameters["dataflow_service_options"] == f"worker_accelerator={L4}"

    import llm_inference  # the launcher passes them back as --name=value; the job's parser takes that form

    args, _ = llm_inference.parse_args([f"--{k}={v}" for k, v in parameters.items() if k not in (
        "gpuflow_job", "dataflow_service_options")])
    assert (args.model_copies, args.require_gpu, args.group_by_length, args.max_new_tokens) == (2, True, True, 64)


# -- GPU usage: Cloud Monitoring (gcp), nvidia-smi (local) ------------------------------------------------------


def handle():
    return JobHandle(kind="dataflow", id="2026-11-29_01_02_03-77", name="gf-x-llm-inference", location="us-central1")


def read_usage(monkeypatch, fake, config) -> dict:
    """The smoke test's GPU-usage read, as its trigger does it in the triggerer (Monitoring faked at its client)."""
    from gpuflow.triggers.monitoring import gpu_usage_trigger

    fake.install(monkeypatch)
    event = first_event(gpu_usage_trigger(config, handle().id, 1_795_000_000, 1_795_000_300))
    return event["usage"]


def test_gpu_usage_reads_both_metrics_of_the_job_over_the_window(monkeypatch):
    fake = FakeGoogleCloud(monitoring=FakeMonitoring(utilization=63, memory=41, empty_polls=1))
    usage = read_usage(monkeypatch, fake, gcp_test_config())
    assert (usage["max_utilization"], usage["max_memory_utilization"], usage["samples"]) == (0.63, 0.41, 4)
    request = fake.metrics.requests[-1]
    assert isinstance(request, monitoring_v3.ListTimeSeriesRequest) and request.name == f"projects/{GCP_TEST_PROJECT}"
    assert request.filter == ('metric.type = "dataflow.googleapis.com/job/gpu_memory_utilization" AND '
                              'resource.type = "dataflow_job" AND metric.labels.job_id = "2026-11-29_01_02_03-77"')
    assert (int(request.interval.start_time.timestamp()), int(request.interval.end_time.timestamp())) == (
        1_795_000_000, 1_795_000_301)
    assert len(fake.metrics.requests) == 4  # one empty poll (metrics lag), then both metrics again


@pytest.mark.parametrize(("setting", "raises"), [("fail", True), ("warn", False), ("ignore", False)])
def test_zero_utilisation_fails_or_warns_as_configured(setting, raises, caplog, monkeypatch):
    fake = FakeGoogleCloud(monitoring=FakeMonitoring(utilization=0, memory=2, empty_polls=0))
    config = gcp_test_config(f"smoke_test.gpu_usage={setting}")
    usage = read_usage(monkeypatch, fake, config)
    if raises:
        with pytest.raises(NoGpuUsage, match="0% utilisation.*require_gpu: true"):
            check_gpu_usage(config, usage)
    else:
        check_gpu_usage(config, usage)
        assert ("0% utilisation" in caplog.text) is (setting == "warn")


def test_metrics_that_never_arrive_are_said_and_do_not_fail(caplog, monkeypatch):
    fake = FakeGoogleCloud(monitoring=FakeMonitoring(empty_polls=10_000))
    config = gcp_test_config("smoke_test.gpu_usage_timeout_s=0.01")
    usage = read_usage(monkeypatch, fake, config)
    check_gpu_usage(config, usage)
    assert "no GPU metrics for job" in caplog.text


def test_local_without_a_gpu_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi anywhere
    usage = LocalPlatform(load_config(None)).gpu_usage(None, 0, 1)
    assert usage["gpus"] == [] and usage["note"] == "no GPU on this machine: inference ran on the CPU"


def test_local_with_a_gpu_reports_nvidia_smi_readings(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text('#!/bin/sh\n[ "$1" = "--query-gpu=name,utilization.gpu,utilization.memory" ] || exit 9\n'
                   'echo "NVIDIA L4, 37, 12"\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert subprocess.run(["nvidia-smi", "-L"]).returncode == 9  # the stub answers only the query gpuflow makes
    usage = LocalPlatform(load_config(None)).gpu_usage(None, 0, 1)
    assert usage["gpus"] == [{"name": "NVIDIA L4", "utilization": 0.37, "memory_utilization": 0.12}]


# -- launch.mode flex_template ----------------------------------------------------------------------------------


def test_flex_mode_makes_the_worker_image_its_own_launcher(tmp_path):
    from dockerfile_parse import DockerfileParser

    from gpuflow.images.containers import FLEX_LAUNCHER, check_dockerfile, render_recipe

    flex = gcp_test_config(*FLEX)
    dockerfile = render_recipe(flex, tmp_path / "flex")
    parsed = DockerfileParser(path=str(dockerfile))
    copies = [i["value"] for i in parsed.structure if i["instruction"] == "COPY"]
    assert f"--from=gcr.io/dataflow-templates-base/python311-template-launcher-base:20260101_RC00 {FLEX_LAUNCHER} " \
           f"{FLEX_LAUNCHER}" in copies
    assert parsed.envs["FLEX_TEMPLATE_PYTHON_PY_FILE"] == "/opt/gpuflow/beam_jobs/flex_main.py"
    assert parsed.envs["PYTHONPATH"] == "/opt/gpuflow/beam_jobs"
    assert check_dockerfile(dockerfile, flex) == []
    direct_dockerfile = render_recipe(gcp_test_config(*DIRECT), tmp_path / "direct")
    assert "FLEX_TEMPLATE_PYTHON_PY_FILE" not in direct_dockerfile.read_text()
    assert [p for p in check_dockerfile(direct_dockerfile, flex) if "flex_template" in p]


def test_preflight_compares_the_launch_environment_only_in_direct_mode():
    from gpuflow.preflight.environment_rules import launch_environment_matches_container

    drifted = ["beam_version=2.60.0", "container.recipe=l4"]
    assert [f.field for f in launch_environment_matches_container(gcp_test_config(*drifted, *DIRECT))] == [
        "beam_version"]
    for flex, why in ((gcp_test_config(*drifted), "the gcp profile's default"), (gcp_test_config(*drifted, *FLEX),
                                                                                "flex_template (launch.mode)")):
        (said,) = launch_environment_matches_container(flex)
        assert (said.level, said.field) == ("info", "launch.mode") and "not compared with the lock" in said.problem
        assert why in said.problem


def test_launch_command_prints_the_flex_request_the_task_sends(capsys, monkeypatch, gcp_connection):
    import json

    from google.cloud import dataflow_v1beta3

    from gpuflow.runs.naming import run_prefix
    from gpuflow.tools.cli import main

    overrides = [f"project={GCP_TEST_PROJECT}", *FLEX, "gpu.sharing=mps",
                 "gpu.machine_type=g2-standard-8"]
    assert main(["launch-command", "--config", "configs/gcp.example.yaml", "--run-id", "manual__7",
                 *(item for o in overrides for item in ("--set", o))]) == 0
    text = capsys.readouterr().out
    printed = dataflow_v1beta3.LaunchFlexTemplateRequest.from_json(text[text.index("{"):])

    config = gcp_test_config(*overrides[1:])
    names = resource_names(config, run_prefix("llm_streaming_inference", "manual__7"))
    fake = FakeGoogleCloud().install(monkeypatch)  # under the provider's DataflowHook
    platform = GcpPlatform(config)
    monkeypatch.setattr(platform, "_gcs", lambda: type("Uploads", (), {"upload": lambda *a, **k: None})())
    image = printed.launch_parameter.environment.sdk_container_image
    platform.launch_pipeline(pipeline_argv(config, names), names, image)
    (sent,) = fake.dataflow.calls("launch_flex_template")
    assert json.loads(type(sent).to_json(sent)) == json.loads(type(printed).to_json(printed))
