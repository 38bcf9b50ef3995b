"""Dataflow's documented constraints on the request Dataflow would receive: requests that Beam's own DataflowRunner
staged into the GCS emulator pass, and each one changed to break a constraint fails with that constraint's name
and page; so do a Flex Template launch and a template launch whose own fields break one."""

import copy
import dataclasses

import pytest
from google.cloud import dataflow_v1beta3

from gpuflow.configuration.loading import load_config
from gpuflow.dataflow.constraints import CONSTRAINTS, DataflowRequestRejected, enforce, violations
from gpuflow.dataflow.options import flex_launch, job_name_for, runtime_environment
from gpuflow.dataflow.request import from_flex_launch, from_staged_job, with_template_launch
from gpuflow.images.containers import image_cuda
from gpuflow.platform.gcp import GcpPlatform
from gpuflow.runs.naming import resource_names
from gpuflow.steps.launch import pipeline_argv
from tests.gcp_fakes import FLEX, FakeGoogleCloud
from tests.helpers import GCP_TEST_PROJECT

BUCKET = "gpuflow-constraints-test"
IMAGE = f"us-central1-docker.pkg.dev/{GCP_TEST_PROJECT}/gpuflow/l4:0a1b2c3d4e5f6a7b"
L4_OPTION = "worker_accelerator=type:nvidia-l4;count:1;install-nvidia-driver"


def gcp_config(*overrides):
    return load_config("configs/gcp.example.yaml", overrides=[
        f"project={GCP_TEST_PROJECT}", f"bucket={BUCKET}", "model.name=google/flan-t5-large",
        "gpu.machine_type=g2-standard-8", "worker.max_num_workers=2", *overrides])


@pytest.fixture
def stage(gcs_bucket, monkeypatch):
    """stage(*overrides) -> (platform, the staged job's JSON, the pipeline proto): Beam's own staging, once."""
    gcs = gcs_bucket(BUCKET)
    FakeGoogleCloud().install(monkeypatch)  # under the provider's hooks

    def staged(*overrides, streaming=True):
        config = gcp_config(*overrides)
        names = resource_names(config, "gf-constr0001")
        platform = GcpPlatform(config)
        _, job = platform.stage_template("llm_inference.py", pipeline_argv(config, names, batch=not streaming), names,
                                         IMAGE, job_name_for(names, config, "llm-inference"), streaming=streaming)
        url = job["environment"]["sdkPipelineOptions"]["options"]["pipelineUrl"]
        bucket, _, blob = url.removeprefix("gs://").partition("/")
        return platform, job, gcs.download(bucket, blob)

    return staged


def broken_by(request) -> set[str]:
    return {violation.constraint.name for violation in violations(request)}


def warned_by(request) -> set[str]:
    """gpuflow's own policies the request breaks: sent anyway, with a warning."""
    from gpuflow.dataflow.constraints import policy_warnings

    return {violation.constraint.name for violation in policy_warnings(request)}


def edited(job, edit):
    job = copy.deepcopy(job)
    edit(job["environment"])
    return job


def test_right_fitting_streaming_request_passes_and_each_change_that_breaks_a_constraint_fails(stage):
    platform, job, proto = stage("gpu.request=resource_hint")
    staged = from_staged_job(job, proto, image_cuda=12)
    assert staged.hints and all(step.startswith("RunInference") for step in staged.hints)
    assert violations(staged) == []
    assert platform.staged_request(job) == dataclasses.replace(staged, image_cuda=image_cuda(platform.config))

    def pool(environment):
        return environment["workerPools"][0]

    changes = {
        "prime-unsupported": edited(job, lambda e: e.setdefault("serviceOptions", []).append("enable_prime")),
        "right-fitting-no-worker-accelerator": edited(
            job, lambda e: e.setdefault("serviceOptions", []).append(L4_OPTION)),
        "streaming-right-fitting": edited(
            job, lambda e: e.update(experiments=[x for x in e["experiments"] if x != "enable_streaming_rightfitting"])),
        "streaming-engine": edited(
            job, lambda e: e.update(experiments=[x for x in e["experiments"] if x != "enable_streaming_engine"])),
        "custom-container": edited(
            job, lambda e: pool(e).update(workerHarnessContainerImage="apache/beam_python3.11_sdk:2.77.0")),
        "l4-minimums": edited(job, lambda e: e["userAgent"].update(version="2.45.0")),
    }
    for name, changed in changes.items():
        assert name in broken_by(from_staged_job(changed, proto, image_cuda=12)), name
    one_worker = from_staged_job(edited(job, lambda e: pool(e)["autoscalingSettings"].update(maxNumWorkers=1)), proto)
    assert broken_by(one_worker) == set() and warned_by(one_worker) == {"streaming-right-fitting-one-worker"}

    # The hint itself, as the pipeline proto carries it.
    (hint,) = set(staged.hints.values())
    elsewhere = dataclasses.replace(staged, hints={**staged.hints, "Validate/Map(validate)": hint})
    no_driver = dataclasses.replace(staged, hints={step: hint.replace(";install-nvidia-driver", "")
                                                   for step in staged.hints})
    wrong_machine = dataclasses.replace(staged, hints={step: hint.replace("g2-standard-8", "n1-standard-8")
                                                       for step in staged.hints})
    old_cuda = dataclasses.replace(staged, image_cuda=11)
    for name, changed in {"install-nvidia-driver": no_driver, "gpu-machine-family": wrong_machine,
                          "l4-minimums": old_cuda}.items():
        assert name in broken_by(changed), name
    assert warned_by(elsewhere) == {"right-fitting-gpu-step"} and "right-fitting-gpu-step" not in broken_by(elsewhere)

    # The template launch's environment on top of the staged job: its machine type restates the pool, so Prime
    # with it is refused too.
    names = resource_names(platform.config, "gf-constr0001")
    launch = runtime_environment(platform.config, names, streaming=True)
    assert launch.enable_streaming_engine and violations(with_template_launch(staged, launch)) == []
    gpu_machine = dataflow_v1beta3.RuntimeEnvironment(machine_type="g2-standard-8", additional_experiments=[])
    prime = dataclasses.replace(staged, service_options=("enable_prime",), machine_type=None)
    assert "prime-unsupported" in broken_by(with_template_launch(prime, gpu_machine))

    # Every constraint has its page, and the message names the constraint and its page.
    assert all(constraint.source and constraint.updated and constraint.fields for constraint in CONSTRAINTS)
    with pytest.raises(DataflowRequestRejected, match=r"prime-unsupported: .*enable-dataflow-prime"):
        enforce(from_staged_job(changes["prime-unsupported"], proto))


def test_worker_accelerator_mps_request_passes_and_breaking_its_constraints_fails(stage):
    _, job, proto = stage("gpu.sharing=mps")
    staged = from_staged_job(job, proto)
    assert staged.hints == {} and violations(staged) == []
    mps = f"{L4_OPTION};use_nvidia_mps"
    assert staged.service_options == (mps,)
    changes = {
        "mps-limits": edited(job, lambda e: e["experiments"].append("no_use_multiple_sdk_containers")),
        "install-nvidia-driver": edited(job, lambda e: e.update(serviceOptions=[mps.replace(";install-nvidia-driver",
                                                                                            "")])),
        "gpu-machine-family": edited(job, lambda e: e["workerPools"][0].update(machineType="n1-standard-8")),
    }
    for name, changed in changes.items():
        assert name in broken_by(from_staged_job(changed, proto)), name
    two_gpus = edited(job, lambda e: e.update(serviceOptions=[mps.replace("count:1", "count:2")]))
    assert {"mps-limits", "gpu-machine-family"} <= broken_by(from_staged_job(two_gpus, proto))
    prime = edited(job, lambda e: e["serviceOptions"].append("enable_prime"))
    assert "prime-unsupported" in broken_by(from_staged_job(prime, proto))


def test_a_flex_template_streaming_launch_keeps_streaming_engine_on(gcs_bucket, monkeypatch):
    gcs_bucket(BUCKET)
    fake = FakeGoogleCloud().install(monkeypatch)  # under the provider's hooks
    config = gcp_config(*FLEX, "gpu.request=resource_hint")
    names = resource_names(config, "gf-constr0002")
    _, request = flex_launch(config, names, "llm_inference", pipeline_argv(config, names), IMAGE,
                             job_name_for(names, config, "llm-inference"), streaming=True)
    parameter = request.launch_parameter
    assert parameter.environment.enable_streaming_engine is True
    assert "enable_streaming_rightfitting" in parameter.environment.additional_experiments
    view = from_flex_launch(parameter, image_cuda=12)
    assert view.streaming and view.hints == {"RunInference": parameter.parameters["accelerator_hint"]}
    assert violations(view) == []
    off = dataflow_v1beta3.LaunchFlexTemplateParameter(parameter)
    off.environment.enable_streaming_engine = False
    assert broken_by(from_flex_launch(off)) == {"streaming-engine"}
    # The launch sends a request only once it passes: with Streaming Engine turned off, nothing reaches Dataflow.
    config = gcp_config(*FLEX, "gpu.request=resource_hint",
                        "dataflow.experiments=[disable_streaming_engine]")
    with pytest.raises(DataflowRequestRejected, match="streaming-engine"):
        GcpPlatform(config).launch_pipeline(pipeline_argv(config, names), names, IMAGE)
    assert fake.dataflow.calls("launch_flex_template") == []
