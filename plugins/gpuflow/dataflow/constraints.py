"""Dataflow's documented constraints, as data, checked on the request gpuflow sends (``gpuflow.dataflow.request``).

Each constraint names what its page states, the page, the date it was read, and the request fields it reads. None
of Google's pages in ../shared/guides, and no copy gpuflow could read of the public pages, shows a "last updated"
date, so ``updated`` says so and gives the day the statement was read. A statement that changes on its page
changes here, in one place; the gcp launch then refuses a request that breaks it, with the page, before anything
reaches Dataflow (and ``gpuflow launch-command --check`` does the same offline).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from gpuflow import catalog
from gpuflow.dataflow.request import GPU_STEP, DataflowRequest

RIGHT_FITTING = "docs.cloud.google.com/dataflow/docs/guides/right-fitting"
PRIME = "docs.cloud.google.com/dataflow/docs/guides/enable-dataflow-prime"
MPS = "docs.cloud.google.com/dataflow/docs/gpu/use-nvidia-mps"
AUTOSCALING = "docs.cloud.google.com/dataflow/docs/horizontal-autoscaling"
STREAMING_ENGINE = "docs.cloud.google.com/dataflow/docs/streaming-engine"
GUIDE_000 = "../shared/guides/000 (Run a pipeline with GPUs)"
GUIDE_003 = "../shared/guides/003 (Use the NVIDIA L4 GPU type)"
READ = "no date shown in the copy read; read 2026-12-01"


class DataflowRequestRejected(ValueError):
    """The request breaks a constraint Dataflow documents; the message names it and its page."""


@dataclass(frozen=True)
class Constraint:
    name: str
    states: str
    source: str
    updated: str
    fields: tuple[str, ...]
    check: Callable[[DataflowRequest], Iterator[str]]
    #: "google": Dataflow documents it, and a request that breaks it is not sent. "gpuflow": gpuflow's own choice
    #: where Google allows more; a request that breaks it is sent, with a warning that says why gpuflow chose it.
    by: str = "google"


@dataclass(frozen=True)
class Violation:
    constraint: Constraint
    problem: str

    def __str__(self) -> str:
        c = self.constraint
        if c.by == "gpuflow":
            return f"{self.problem} [{c.name}, gpuflow's policy: {c.states} ({c.source})]"
        return f"{self.problem} [{c.name}: {c.source} says {c.states!r} ({c.updated})]"


def _prime_unsupported(request: DataflowRequest) -> Iterator[str]:
    if not request.prime:
        return
    if request.machine_type:
        yield f"the {request.kind} asks for Dataflow Prime (enable_prime) and names machine type {request.machine_type}"
    if any(ask.use_mps for ask in request.gpu_asks()):
        yield f"the {request.kind} asks for Dataflow Prime and NVIDIA MPS (use_nvidia_mps)"


def _right_fitting_without_worker_accelerator(request: DataflowRequest) -> Iterator[str]:
    asks = request.gpu_asks()
    if any(ask.where.startswith("hint") for ask in asks) and any(ask.where == "worker_accelerator" for ask in asks):
        yield f"the {request.kind} carries an accelerator hint and the worker_accelerator service option"


def _hint_on_the_gpu_step_only(request: DataflowRequest) -> Iterator[str]:
    others = sorted(name for name in request.hints or {} if name.split("/")[0] not in GPU_STEP.values())
    if others:
        yield f"the {request.kind} puts the accelerator hint on {others}, not only on {sorted(GPU_STEP.values())}"


def _streaming_right_fitting(request: DataflowRequest) -> Iterator[str]:
    if not (request.streaming and request.hints):
        return
    if "enable_streaming_rightfitting" not in request.experiments:
        yield f"the streaming {request.kind} has an accelerator hint but not --experiments=enable_streaming_rightfitting"
    if request.autoscaling_algorithm == "AUTOSCALING_ALGORITHM_NONE":
        yield f"the streaming {request.kind} has an accelerator hint and autoscaling turned off"


def _streaming_right_fitting_one_worker(request: DataflowRequest) -> Iterator[str]:
    if request.streaming and request.hints and request.max_workers is not None and request.max_workers <= 1:
        yield f"the streaming {request.kind} has an accelerator hint and at most {request.max_workers} worker"


def _mps_limits(request: DataflowRequest) -> Iterator[str]:
    for ask in request.gpu_asks():
        if not ask.use_mps:
            continue
        if ask.count is not None and ask.count > 1:
            yield f"{ask.where} asks for MPS with {ask.count} GPUs"
        if "no_use_multiple_sdk_containers" in request.experiments:
            yield f"{ask.where} asks for MPS and the experiments hold no_use_multiple_sdk_containers"


def _machine_fits_gpu(request: DataflowRequest) -> Iterator[str]:
    for ask in request.gpu_asks():
        gpu = catalog.gpu_type(ask.type)
        if gpu is None:
            yield f"{ask.where} asks for {ask.type!r}, which is no Dataflow GPU type ({sorted(catalog.gpu_types())})"
            continue
        machine = catalog.machine_spec(ask.machine_type) if ask.machine_type else None
        if ask.machine_type and machine is None and not ask.machine_type.startswith("n1-"):
            yield f"{ask.where}: {ask.type} on {ask.machine_type}, which is no machine type that takes GPUs"
        elif machine is not None and machine.family not in gpu.families:
            yield f"{ask.where}: {ask.type} attaches only to {'/'.join(gpu.families)} machines, not {ask.machine_type}"
        elif machine is not None and machine.fixed_gpu is not None and (
                machine.fixed_gpu, machine.fixed_gpu_count) != (gpu.name, ask.count):
            yield f"{ask.where}: {ask.machine_type} comes with {machine.fixed_gpu_count} x {machine.fixed_gpu}, not " \
                  f"{ask.count} x {ask.type}"
        elif machine is not None and machine.fixed_gpu is None and gpu.counts and ask.count not in gpu.counts:
            yield f"{ask.where}: {ask.type} on N1 comes in counts {list(gpu.counts)}, not {ask.count}"


def _driver_installed(request: DataflowRequest) -> Iterator[str]:
    for ask in request.gpu_asks():
        if not ask.install_driver:
            yield f"{ask.where} asks for {ask.type} without install-nvidia-driver"


def _l4_minimums(request: DataflowRequest) -> Iterator[str]:
    gpu = catalog.gpu_type("nvidia-l4")
    if gpu is None or not any(ask.type == gpu.name for ask in request.gpu_asks()):
        return
    if request.beam_version and gpu.min_beam \
            and catalog.version_tuple(request.beam_version) < catalog.version_tuple(gpu.min_beam):
        yield f"the {request.kind} was staged by Beam {request.beam_version}; L4 needs {gpu.min_beam} or later"
    if request.image_cuda is not None and gpu.min_cuda is not None and request.image_cuda < gpu.min_cuda:
        yield f"the image is built for CUDA {request.image_cuda}; L4 needs CUDA {gpu.min_cuda} or later"


def _custom_container(request: DataflowRequest) -> Iterator[str]:
    if request.gpu_asks() and (not request.image or request.image.startswith(("apache/beam_python", "gcr.io/cloud-dataflow/"))):
        yield f"the {request.kind} asks for GPUs without a custom container image (image: {request.image or 'none'})"


def _streaming_engine(request: DataflowRequest) -> Iterator[str]:
    if request.streaming and not request.streaming_engine:
        yield f"the streaming {request.kind} does not turn Streaming Engine on"


CONSTRAINTS: tuple[Constraint, ...] = (
    Constraint("prime-unsupported", "Unsupported features: Designating specific VM types by using the flag "
               "--worker_machine_type or --machine_type for Python pipelines; Dataflow Prime doesn't support MPS",
               f"{PRIME}; {MPS}", READ, ("service_options", "machine_type", "gpu asks"), _prime_unsupported),
    Constraint("right-fitting-no-worker-accelerator", "When you use right fitting, don't use the worker_accelerator "
               "service option", RIGHT_FITTING, READ, ("service_options", "hints"),
               _right_fitting_without_worker_accelerator),
    Constraint("right-fitting-gpu-step", "the accelerator hint only on the step that uses the GPU, so that the other "
               "steps run on CPU workers (the right-fitting page also allows a pipeline-wide hint)", RIGHT_FITTING,
               READ, ("hints",), _hint_on_the_gpu_step_only, by="gpuflow"),
    Constraint("streaming-right-fitting", "Right fitting is supported with streaming pipelines with horizontal "
               "autoscaling enabled. You can enable it by setting the --experiments=enable_streaming_rightfitting "
               "pipeline option", RIGHT_FITTING, READ,
               ("streaming", "hints", "experiments", "autoscaling_algorithm"), _streaming_right_fitting),
    Constraint("streaming-right-fitting-one-worker", "more than one worker for streaming right fitting: with one at "
               "most, horizontal autoscaling has nothing to scale (Google's way to turn it off is "
               "--autoscaling_algorithm=NONE, checked above)", f"{RIGHT_FITTING}; {AUTOSCALING}", READ,
               ("streaming", "hints", "max_workers"), _streaming_right_fitting_one_worker, by="gpuflow"),
    Constraint("mps-limits", "MPS is supported only on workers that use a single GPU; it shares one GPU between the "
               "SDK processes of a worker", MPS, READ, ("gpu asks", "experiments"), _mps_limits),
    Constraint("gpu-machine-family", "each GPU type attaches to its own machine family and counts (gpuflow's table, "
               "catalog/gpus.yaml)", f"{GUIDE_000}; {GUIDE_003}; catalog/gpus.yaml",
               f"table as of {catalog.table_date('machine_types')}", ("gpu asks", "machine_type"), _machine_fits_gpu),
    Constraint("install-nvidia-driver", "To install NVIDIA drivers on the Dataflow workers, append "
               "install-nvidia-driver to the worker_accelerator service option", GUIDE_000, READ, ("gpu asks",),
               _driver_installed),
    Constraint("l4-minimums", "Apache Beam SDK 2.46 or later (2.50 or later recommended); NVIDIA driver 525.0 or later "
               "and CUDA toolkit 12.0 or later", GUIDE_003, READ, ("gpu asks", "beam_version", "image_cuda"),
               _l4_minimums),
    Constraint("custom-container", "provide an image with the GPU libraries with the sdk_container_image pipeline "
               "option (Runner v2)", GUIDE_000, READ, ("gpu asks", "image"), _custom_container),
    Constraint("streaming-engine", "Streaming only supports using Dataflow Portable Runner (aka unified worker, runner "
               "v2). Dataflow Portable Runner only supports using streaming engine (aka windmill service)",
               "apache_beam/runners/dataflow/dataflow_runner.py (Beam 2.77), which therefore turns Streaming Engine "
               "on for every streaming Python job", "Beam 2.77.0's source", ("streaming", "streaming_engine"),
               _streaming_engine),
)


def violations(request: DataflowRequest) -> list[Violation]:
    """What the request breaks of Google's documented rules (each stops the launch)."""
    return _violations(request)["google"]


def policy_warnings(request: DataflowRequest) -> list[Violation]:
    """What the request breaks of gpuflow's own policies, where Google allows more (each a warning)."""
    return _violations(request)["gpuflow"]


def _violations(request: DataflowRequest) -> dict[str, list[Violation]]:
    """Every constraint checked once, what it found filed by whose rule it is."""
    found: dict[str, list[Violation]] = {"google": [], "gpuflow": []}
    for constraint in CONSTRAINTS:
        found[constraint.by] += [Violation(constraint, problem) for problem in constraint.check(request)]
    return found


def enforce(request: DataflowRequest) -> DataflowRequest:
    """Raise before the request is sent when it breaks any of Google's rules, every broken one named; log each of
    gpuflow's policies it breaks."""
    import logging

    found = _violations(request)
    for warning in found["gpuflow"]:
        logging.getLogger(__name__).warning("the %s is sent although %s", request.kind, warning)
    broken = found["google"]
    if broken:
        raise DataflowRequestRejected(f"gpuflow did not send the {request.kind}; Dataflow documents that it would "
                                      "not run:\n" + "\n".join(f"  - {violation}" for violation in broken))
    return request
