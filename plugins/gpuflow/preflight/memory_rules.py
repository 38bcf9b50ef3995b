"""GPU memory and sharing rules: one model copy must fit the GPU and the worker, and every copy the sharing mode
keeps on a GPU must fit it together (processes x copies x one copy's memory, in every mode). The numbers come from
``gpu_options`` and the catalog; gpu_rules lists these among the GPU readiness rules."""

from __future__ import annotations

from collections.abc import Iterator

from gpuflow import catalog
from gpuflow.configuration.model import GpuflowConfig
from gpuflow.dataflow.gpu_options import (
    PREFIX,
    effective_dtype,
    effective_sharing,
    kv_cache_gb,
    model_gpu_share,
    model_memory_gb,
    model_parameters_m,
    resident_copies,
)
from gpuflow.preflight.findings import Finding, error, info, warning


def _sizes(config: GpuflowConfig) -> tuple[catalog.GpuType | None, catalog.MachineSpec | None, float | None,
                                          float | None]:
    """The GPU, the worker's machine type, one model copy's memory (GB) and its share of the GPU (None: unknown)."""
    return (catalog.gpu_type(config.gpu.type), catalog.machine_spec(config.gpu.machine_type),
            model_memory_gb(config), model_gpu_share(config))


def dtype_for_gpu(config: GpuflowConfig) -> Iterator[Finding]:
    gpu = catalog.gpu_type(config.gpu.type)
    if gpu is None or gpu.bf16:
        return
    if config.model.dtype == "bfloat16":
        yield error("model.dtype", f"{gpu.name} has no bfloat16; T5 models overflow to NaN in float16",
                    "set model.dtype: float32 (it doubles the memory the weights need) or use an L4/A100 GPU")
    else:
        yield warning("model.dtype", f"{gpu.name} has no bfloat16, so the model runs in float32, which doubles "
                      "the memory the weights need (float16 is not an option: T5 overflows to NaN)",
                      "check the memory findings, or use nvidia-l4 for bfloat16")


def _kv_cache_counted(config: GpuflowConfig) -> Iterator[Finding]:
    """Say what the memory figure holds for a decoder-only model: its KV cache, or that the catalog lacks its shape."""
    size = catalog.model_size(config.model.name)
    if size is None or size.architecture != "causal":
        return
    cache_gb = kv_cache_gb(config)
    tokens = config.model.max_input_tokens + config.model.max_new_tokens
    if cache_gb is None:
        yield warning("model.name", f"the catalog has no KV-cache shape for {config.model.name}, so its KV cache "
                      f"({config.inference.max_batch_size} prompts of up to {tokens} tokens) is not counted",
                      "leave headroom on the GPU, or lower inference.max_batch_size")
    else:
        yield info("inference.max_batch_size", f"the memory figure counts {config.model.name}'s KV cache: "
                   f"{cache_gb:.2f} GB for {config.inference.max_batch_size} prompts of up to {tokens} tokens",
                   "lower inference.max_batch_size or model.max_input_tokens to need less")


def model_memory_fits(config: GpuflowConfig) -> Iterator[Finding]:
    """The copy must fit the GPU and the worker; how copies share the GPU is gpu_request_and_sharing's."""

    gpu, machine, needed_gb, share = _sizes(config)
    parameters_m = model_parameters_m(config)
    if parameters_m is None or needed_gb is None:
        yield warning("model.parameters_m", f"the catalog does not know the size of {config.model.name}",
                      "set model.parameters_m so preflight can check GPU and worker memory")
        return
    yield from _kv_cache_counted(config)
    if gpu is None or share is None:
        return
    dtype = effective_dtype(config)
    numbers = f"{parameters_m:g}M parameters in {dtype} need about {needed_gb:.1f} GB; one {gpu.name} has {gpu.memory_gb} GB"
    if share > 1:
        yield error("gpu.type", f"the model does not fit: {numbers}",
                    "use a GPU with more memory (nvidia-a100-80gb), bfloat16, or a smaller model")
    if machine is not None and needed_gb > machine.memory_gb * 0.8:
        yield error("gpu.machine_type", f"{machine.name} has {machine.memory_gb:g} GB of memory; loading the model "
                    f"needs about {needed_gb:.1f} GB on the worker too",
                    "use a machine type with more memory")


def model_copies_need_their_sharing(config: GpuflowConfig) -> Iterator[Finding]:
    """gpu.model_copies is read only with gpu.sharing: model_copies; anywhere else it would be silently ignored."""
    if config.gpu.model_copies > 1 and config.gpu.sharing != "model_copies":
        yield warning("gpu.model_copies", f"gpu.model_copies is {config.gpu.model_copies}, but gpu.sharing is "
                      f"{config.gpu.sharing}, so each process loads one copy and the setting is ignored",
                      "set gpu.sharing: model_copies, or leave gpu.model_copies at 1")


def gpu_request_and_sharing(config: GpuflowConfig) -> Iterator[Finding]:
    """How the GPU is asked for and shared; explains the choice with the memory numbers (the guides' advice)."""

    gpu, machine, needed_gb, share = _sizes(config)
    sharing = effective_sharing(config)
    hand_written = [o for o in config.dataflow_service_options if o.startswith(PREFIX)]
    if config.gpu.request == "resource_hint" and hand_written:
        yield error("gpu.request", "resource_hint puts the GPU on the RunInference step; a worker_accelerator in "
                    "dataflow_service_options would give every worker a GPU as well",
                    "remove worker_accelerator from dataflow_service_options (use one or the other, never both)")
    if sharing == "mps":
        # docs.cloud.google.com/dataflow/docs/gpu/use-nvidia-mps, "Support and limitations".
        if config.gpu.count > 1:
            yield error("gpu.sharing", f"MPS is supported only on Dataflow workers that use a single GPU; "
                        f"gpu.count is {config.gpu.count}", "set gpu.count: 1, or another gpu.sharing")
        if "enable_prime" in config.dataflow_service_options:
            yield error("gpu.sharing", "Dataflow Prime doesn't support MPS, and dataflow_service_options has "
                        "enable_prime", "drop enable_prime, or use another gpu.sharing")
        if "no_use_multiple_sdk_containers" in config.dataflow.experiments:
            yield error("gpu.sharing", "MPS shares the GPU between several SDK processes, and "
                        "no_use_multiple_sdk_containers leaves only one", "drop one: mps or single_process")
        if machine is not None and machine.vcpus <= 1:
            yield error("gpu.sharing", f"MPS helps Python pipelines on workers with more than one vCPU; "
                        f"{machine.name} has {machine.vcpus}", "use a machine type with more vCPUs, or sharing: auto")
        if config.gpu.request == "resource_hint":
            yield error("gpu.sharing", "gpuflow turns MPS on through worker_accelerator (use_nvidia_mps), which "
                        "resource_hint does not send", "use gpu.request: worker_accelerator with mps")
    yield from _every_copy_fits(config, sharing)
    if sharing == "single_process" and machine is not None and machine.vcpus == 1:
        yield info("gpu.sharing", f"{machine.name} has one vCPU, so it runs one SDK process anyway",
                   "no_use_multiple_sdk_containers is still sent; a single-vCPU custom type is the guide's alternative")
    if config.traits.dataflow_workers and config.gpu.sharing == "auto" and share is not None and gpu is not None \
            and machine is not None and needed_gb is not None:
        if config.inference.engine == "vllm":
            chosen = (f"Dataflow's default of one SDK process per vCPU ({machine.vcpus}); Beam shares one vLLM "
                      "server per worker across them")
        elif sharing == "single_process":
            chosen = (f"one SDK process per worker (no_use_multiple_sdk_containers): {machine.vcpus} processes, "
                      f"one copy each, would need {machine.vcpus * needed_gb:.1f} GB")
        else:
            chosen = (f"Dataflow's default of one SDK process per vCPU ({machine.vcpus}), each with its own copy: "
                      f"{machine.vcpus * needed_gb:.1f} GB in all")
        yield info("gpu.sharing", f"one model copy needs about {needed_gb:.1f} GB, {share:.0%} of one "
                   f"{gpu.name} ({gpu.memory_gb} GB)", f"gpuflow uses {chosen}")


def _every_copy_fits(config: GpuflowConfig, sharing: str) -> Iterator[Finding]:
    """Processes x copies x one copy's memory must fit one GPU, in every sharing mode (auto picks a layout that
    does; one copy too large for the GPU is model_memory_fits's error)."""
    gpu, _, needed_gb, share = _sizes(config)
    copies = resident_copies(config, sharing)
    if gpu is None or share is None or needed_gb is None or copies is None or share > 1 or share * copies <= 1:
        return
    fitting = max(1, int(1 / share))
    numbers = (f"{copies} copies of {needed_gb:.1f} GB ({copies * needed_gb:.1f} GB) do not fit in one "
               f"{gpu.name}'s {gpu.memory_gb} GB")
    if sharing == "model_copies":
        yield error("gpu.model_copies", numbers, f"set gpu.model_copies to {fitting}")
    else:  # mps: MPS shares the GPU's compute between the SDK processes, and each still loads its own copy
        yield error("gpu.sharing", f"with {sharing}, each of {config.gpu.machine_type}'s {copies} SDK processes "
                    f"loads its own model copy: {numbers}",
                    f"set gpu.sharing: model_copies with gpu.model_copies: {fitting} (shared across the processes), "
                    "gpu.sharing: single_process, or gpu.sharing: auto")
