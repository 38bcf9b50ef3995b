"""GPU sizing and GPU options in one place: the inference dtype, the memory a model copy takes and its share
of the GPU; Dataflow's worker_accelerator option, the right-fitting hint and the sharing mode. Preflight's GPU
rules read from here; nothing here reads preflight.

Dataflow wants ``worker_accelerator=type:GPU;count:N;install-nvidia-driver`` with the tokens in
that order (``use_nvidia_mps`` may follow). A hand-written option with tokens out of order or
malformed fails at job submission, or worse, runs without a driver.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuflow import catalog
from gpuflow.configuration.model import GpuflowConfig

PREFIX = "worker_accelerator="
_ORDER = ("type", "count", "install-nvidia-driver")
_OPTIONAL_TRAILING = ("use_nvidia_mps",)


class AcceleratorOptionError(ValueError):
    pass


@dataclass(frozen=True)
class WorkerAccelerator:
    type: str
    count: int
    install_driver: bool
    use_mps: bool = False

    def option(self) -> str:
        tokens = [f"type:{self.type}", f"count:{self.count}"]
        if self.install_driver:
            tokens.append("install-nvidia-driver")
        if self.use_mps:
            tokens.append("use_nvidia_mps")
        return PREFIX + ";".join(tokens)


def worker_accelerator(config: GpuflowConfig) -> str:
    """The option gpuflow sends: always with the driver, which Dataflow installs on the host; MPS when chosen."""
    return WorkerAccelerator(config.gpu.type, config.gpu.count, install_driver=True,
                             use_mps=effective_sharing(config) == "mps").option()


#: Dataflow's right-fitting page (docs.cloud.google.com/dataflow/docs/guides/right-fitting), "accelerator":
#: ``type:GPU_TYPE;count:GPU_COUNT;machine_type:MACHINE_TYPE;CONFIGURATION_OPTIONS`` -- the GPU's machine type
#: goes inside the hint.
def accelerator_hint(config: GpuflowConfig) -> str:
    """Beam's ``accelerator`` resource hint for right fitting, with the GPU's machine type inside it."""
    return (f"type:{config.gpu.type};count:{config.gpu.count};machine_type:{config.gpu.machine_type};"
            "install-nvidia-driver")


def right_fitting(config: GpuflowConfig) -> bool:
    """The GPU is asked for with the accelerator hint on the GPU step (gpu.request resource_hint, on GPU workers)."""
    return config.uses_gpu and config.gpu.request == "resource_hint"


def uses_prime(config: GpuflowConfig) -> bool:
    """Dataflow Prime only where the configuration asks for it (``enable_prime`` in dataflow_service_options): right
    fitting does not need it ("When you use a resource hint in your pipeline, right fitting is automatically
    enabled", docs.cloud.google.com/dataflow/docs/guides/right-fitting)."""
    return "enable_prime" in config.dataflow_service_options


def pipeline_machine_type(config: GpuflowConfig) -> str | None:
    """The pipeline's ``--machine_type``. worker_accelerator (and CPU workers): gpu.machine_type. resource_hint: a CPU
    machine for the steps without the hint (worker.machine_type, else guide 002's n2-highmem type for the model);
    the GPU's machine type goes only inside the hint, which wins for the hinted step (the right-fitting page).
    With Dataflow Prime: None, since Prime lists "Designating specific VM types by using the flag
    --worker_machine_type or --machine_type for Python pipelines" among its unsupported features
    (docs.cloud.google.com/dataflow/docs/guides/enable-dataflow-prime)."""
    if not right_fitting(config):
        return config.gpu.machine_type
    if uses_prime(config):
        return None
    return config.worker.machine_type or catalog.cpu_worker_machine_for(config.model.name, model_parameters_m(config))


def effective_sharing(config: GpuflowConfig) -> str:
    """gpu.sharing, with ``auto`` decided by the memory every resident copy takes ("default": Dataflow's own).

    Dataflow's default runs one SDK process per vCPU, each with its own model copy, so auto keeps it only where
    that many copies fit the GPU together; otherwise one SDK process. vLLM runs one server per worker, which Beam
    shares across the SDK processes, so the default layout holds one copy.
    """
    if config.gpu.sharing != "auto":
        return config.gpu.sharing
    if not config.uses_gpu:  # guide 002's CPU pipeline: one SDK process, so each worker loads the model once
        return "single_process"
    if config.inference.engine == "vllm":
        return "default"
    share, copies = model_gpu_share(config), resident_copies(config, "default")
    return "single_process" if share is not None and copies is not None and share * copies > 1 else "default"


def resident_copies(config: GpuflowConfig, sharing: str | None = None) -> int | None:
    """How many model copies one worker's GPU holds under a sharing mode (None: the machine type is unknown).

    default and mps: one per SDK process, and Dataflow starts one per vCPU (MPS shares the GPU's compute, not its
    memory). single_process: one. model_copies: gpu.model_copies, shared across the processes. vLLM: its server.
    """
    sharing = sharing or effective_sharing(config)
    if config.inference.engine == "vllm" or sharing == "single_process":
        return 1
    if sharing == "model_copies":
        return config.gpu.model_copies
    machine = catalog.machine_spec(config.gpu.machine_type)
    return None if machine is None else machine.vcpus


def parse_worker_accelerator(option: str) -> WorkerAccelerator:
    """Parse ``worker_accelerator=...``; raise with the exact problem and the expected form."""
    expected = "expected worker_accelerator=type:GPU_TYPE;count:N;install-nvidia-driver"
    if not option.startswith(PREFIX):
        raise AcceleratorOptionError(f"{option!r} does not start with {PREFIX!r}; {expected}")
    tokens = [token.strip() for token in option[len(PREFIX):].split(";")]
    if any(not token for token in tokens):
        raise AcceleratorOptionError(f"{option!r} has an empty token (a stray ';'); {expected}")
    names = [token.split(":", 1)[0] for token in tokens]
    unknown = [n for n in names if n not in _ORDER + _OPTIONAL_TRAILING]
    if unknown:
        raise AcceleratorOptionError(f"{option!r} has unknown tokens {unknown}; {expected}")
    required = [n for n in names if n in _ORDER]
    if required[:2] != ["type", "count"] or names[:2] != ["type", "count"]:
        raise AcceleratorOptionError(f"{option!r}: tokens out of order, type and count must come first; {expected}")
    if required != [n for n in _ORDER if n in required] or (
        "install-nvidia-driver" in names and names.index("install-nvidia-driver") != 2
    ):
        raise AcceleratorOptionError(f"{option!r}: tokens out of order; {expected}")
    values = {name: value for name, _, value in (token.partition(":") for token in tokens)}
    if not values["type"]:
        raise AcceleratorOptionError(f"{option!r}: type has no value; {expected}")
    if not values["count"].isdigit() or int(values["count"]) < 1:
        raise AcceleratorOptionError(f"{option!r}: count must be a positive integer; {expected}")
    return WorkerAccelerator(
        type=values["type"],
        count=int(values["count"]),
        install_driver="install-nvidia-driver" in values,
        use_mps="use_nvidia_mps" in values,
    )


# -- sizing ---------------------------------------------------------------------------------------------


def effective_dtype(config: GpuflowConfig) -> str:
    """model.dtype, with auto decided by the GPU: bfloat16 where it computes in bf16, else float32 (and on CPU
    workers, gpu.type none)."""
    gpu = catalog.gpu_type(config.gpu.type)
    if config.model.dtype != "auto":
        return config.model.dtype
    if not config.uses_gpu:
        return "float32"
    return "bfloat16" if gpu is None or gpu.bf16 else "float32"


def model_parameters_m(config: GpuflowConfig) -> float | None:
    """model.parameters_m, or the catalog's size for a known model; None when neither knows."""
    if config.model.parameters_m:
        return config.model.parameters_m
    size = catalog.model_size(config.model.name)
    return size.parameters_m if size else None


def kv_cache_gb(config: GpuflowConfig) -> float | None:
    """A decoder-only model's KV cache at its fullest: keys and values of every layer for a whole batch of
    ``inference.max_batch_size`` prompts of ``model.max_input_tokens`` plus ``model.max_new_tokens`` tokens; None
    when the catalog has no KV shape for the model (or it is seq2seq, whose overhead covers short answers)."""
    size = catalog.model_size(config.model.name)
    if size is None or size.architecture != "causal" or size.layers is None or size.kv_heads is None \
            or size.head_dim is None:
        return None
    tokens = config.inference.max_batch_size * (config.model.max_input_tokens + config.model.max_new_tokens)
    per_token = 2 * size.layers * size.kv_heads * size.head_dim * catalog.bytes_per_parameter(effective_dtype(config))
    return tokens * per_token / 1e9


def model_memory_gb(config: GpuflowConfig) -> float | None:
    """Weights plus runtime overhead in the inference dtype, plus a decoder-only model's KV cache; None when the
    model's size is unknown."""
    parameters_m = model_parameters_m(config)
    if parameters_m is None:
        return None
    weights = parameters_m * 1e6 * catalog.bytes_per_parameter(effective_dtype(config)) * catalog.runtime_overhead()
    return weights / 1e9 + (kv_cache_gb(config) or 0.0)


def model_gpu_share(config: GpuflowConfig) -> float | None:
    """The share of one GPU's memory a model copy takes; None when the model or GPU is unknown."""
    gpu = catalog.gpu_type(config.gpu.type)
    needed_gb = model_memory_gb(config)
    return None if gpu is None or needed_gb is None else needed_gb / gpu.memory_gb
