"""A Dataflow job request as Dataflow receives it, read into one shape for ``gpuflow.dataflow.constraints``.

Three requests reach Dataflow, and each is read as sent, not rebuilt from the configuration:
- the job that Beam's DataflowRunner staged (``--template_location``): environment, experiments, service options,
  the worker pool, and the resource hints of each transform in the staged pipeline proto;
- that job with the classic template launch's ``RuntimeEnvironment`` on top (it adds experiments and restates
  the worker pool);
- a Flex Template launch (``LaunchFlexTemplateParameter``): its parameters and environment. The pipeline itself is
  built inside the image there, so its hints are read from the ``accelerator_hint`` parameter and its Beam version
  is not in the request.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

#: Beam's URN of the accelerator resource hint in a pipeline proto's environments.
ACCELERATOR_HINT_URN = "beam:resources:accelerator:v1"
#: The step of each gpuflow job that needs the GPU: the one that may carry the accelerator hint.
GPU_STEP = {"llm_inference": "RunInference", "gpu_check": "InspectWorker"}


@dataclass(frozen=True)
class GpuAsk:
    """One way the request asks for GPUs: the worker_accelerator service option, or an accelerator hint."""

    where: str  # "worker_accelerator", or "hint on STEP"
    type: str
    count: int | None
    machine_type: str | None  # the hint's own machine type; for worker_accelerator, the request's machine type
    install_driver: bool
    use_mps: bool


@dataclass(frozen=True)
class DataflowRequest:
    """What a rule may read. ``None`` means the request does not state it (never: a default was assumed)."""

    kind: str  # "staged job", "template launch", "flex template launch"
    streaming: bool
    service_options: tuple[str, ...] = ()
    experiments: tuple[str, ...] = ()
    machine_type: str | None = None
    max_workers: int | None = None
    autoscaling_algorithm: str | None = None
    streaming_engine: bool | None = None
    image: str | None = None
    beam_version: str | None = None
    # transform name -> its accelerator hint; None where the request carries no pipeline to read them from
    hints: dict[str, str] | None = field(default=None)
    # The CUDA major version the image was built for (its recipe's label), where gpuflow built it; None: unknown.
    image_cuda: int | None = None

    @property
    def prime(self) -> bool:
        return "enable_prime" in self.service_options

    def gpu_asks(self) -> list[GpuAsk]:
        """Every GPU the request asks for: its worker_accelerator options and its accelerator hints."""
        asks = []
        for option in self.service_options:
            if option.startswith("worker_accelerator="):
                tokens = _tokens(option.removeprefix("worker_accelerator="))
                asks.append(GpuAsk("worker_accelerator", tokens.get("type", ""), _count(tokens),
                                   self.machine_type, "install-nvidia-driver" in tokens, "use_nvidia_mps" in tokens))
        for step, hint in sorted((self.hints or {}).items()):
            tokens = _tokens(hint)
            asks.append(GpuAsk(f"hint on {step}", tokens.get("type", ""), _count(tokens), tokens.get("machine_type"),
                               "install-nvidia-driver" in tokens, "use_nvidia_mps" in tokens))
        return asks


def _tokens(value: str) -> dict[str, str]:
    """``type:nvidia-l4;count:1;install-nvidia-driver`` -> {"type": "nvidia-l4", "count": "1", "install-nvidia-driver": ""}."""
    pairs = (token.strip().partition(":") for token in value.split(";") if token.strip())
    return {name: value for name, _, value in pairs}


def _count(tokens: dict[str, str]) -> int | None:
    return int(tokens["count"]) if tokens.get("count", "").isdigit() else None


def pipeline_hints(pipeline_proto: bytes) -> dict[str, str]:
    """Each transform of a staged pipeline proto that carries the accelerator hint, with the hint (Beam puts resource
    hints on the environment its transforms run in)."""
    from apache_beam.portability.api import beam_runner_api_pb2

    pipeline = beam_runner_api_pb2.Pipeline.FromString(pipeline_proto)
    environments = pipeline.components.environments
    hints = {}
    for transform in pipeline.components.transforms.values():
        if transform.environment_id and transform.environment_id in environments:
            hint = environments[transform.environment_id].resource_hints.get(ACCELERATOR_HINT_URN)
            if hint:
                hints[transform.unique_name] = hint.decode()
    return hints


def from_staged_job(job: dict[str, Any], pipeline_proto: bytes | None = None,
                    image_cuda: int | None = None) -> DataflowRequest:
    """The job request Beam wrote with ``--template_location`` (its JSON), and its pipeline proto if read."""
    environment = job.get("environment", {})
    pools = environment.get("workerPools") or [{}]
    pool = pools[0]
    options = environment.get("sdkPipelineOptions", {}).get("options", {})
    autoscaling = pool.get("autoscalingSettings", {})
    experiments = tuple(environment.get("experiments", []))
    return DataflowRequest(
        kind="staged job",
        streaming=job.get("type") == "JOB_TYPE_STREAMING",
        service_options=tuple(environment.get("serviceOptions", [])),
        experiments=experiments,
        machine_type=pool.get("machineType") or None,
        max_workers=autoscaling.get("maxNumWorkers"),
        autoscaling_algorithm=autoscaling.get("algorithm"),
        streaming_engine="enable_streaming_engine" in experiments and "disable_streaming_engine" not in experiments,
        image=pool.get("workerHarnessContainerImage") or options.get("sdk_container_image"),
        beam_version=environment.get("userAgent", {}).get("version"),
        hints=pipeline_hints(pipeline_proto) if pipeline_proto is not None else None,
        image_cuda=image_cuda,
    )


def with_template_launch(staged: DataflowRequest, environment: Any) -> DataflowRequest:
    """The staged job as a classic template launch's ``RuntimeEnvironment`` changes it: its machine type and worker
    count restate the pool, its experiments are added, and it may turn Streaming Engine on (a false there is proto3's
    unset, so it leaves the staged job's choice)."""
    return dataclasses.replace(
        staged,
        kind="template launch",
        machine_type=environment.machine_type or staged.machine_type,
        max_workers=environment.max_workers or staged.max_workers,
        experiments=tuple(dict.fromkeys([*staged.experiments, *environment.additional_experiments])),
        streaming_engine=bool(staged.streaming_engine or environment.enable_streaming_engine),
    )


def from_flex_launch(parameter: Any, image_cuda: int | None = None) -> DataflowRequest:
    """A ``LaunchFlexTemplateParameter`` as sent. llm_inference.py builds a streaming pipeline when it is given a
    Pub/Sub subscription to read (``messages_subscription``), and a batch one otherwise."""
    parameters = dict(parameter.parameters)
    environment = parameter.environment
    step = GPU_STEP.get(parameters.get("gpuflow_job", ""), "RunInference")
    hint = parameters.get("accelerator_hint")
    return DataflowRequest(
        kind="flex template launch",
        streaming="messages_subscription" in parameters,
        service_options=tuple(option for option in parameters.get("dataflow_service_options", "").split(",") if option),
        experiments=tuple(environment.additional_experiments),
        machine_type=environment.machine_type or None,
        max_workers=environment.max_workers or None,
        streaming_engine=environment.enable_streaming_engine
        and "disable_streaming_engine" not in environment.additional_experiments,
        image=environment.sdk_container_image or None,
        hints={step: hint} if hint else {},
        image_cuda=image_cuda,
    )
