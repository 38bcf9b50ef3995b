"""GPU readiness rules: what the Dataflow GPU guides say fails, checked before any worker starts.

Each rule reads the catalog (plugins/gpuflow/catalog/*.yaml), not if-chains.
"""

from __future__ import annotations

from collections.abc import Iterator

from gpuflow import catalog
from gpuflow.config import GpuflowConfig
from gpuflow.preflight.findings import Finding, error, info, warning

#: Share of a GPU's memory above which one model copy per process is the only copy that fits.
SINGLE_PROCESS_SHARE = 0.5


def gpu_type_known(config: GpuflowConfig) -> Iterator[Finding]:
    if catalog.gpu_type(config.gpu.type) is None:
        yield error("gpu.type", f"{config.gpu.type!r} is not a Dataflow GPU type",
                    f"use one of {sorted(catalog.gpu_types())}")


def machine_type_fits_gpu(config: GpuflowConfig) -> Iterator[Finding]:
    gpu = catalog.gpu_type(config.gpu.type)
    if gpu is None:
        return
    machine = catalog.machine_spec(config.gpu.machine_type)
    fitting = catalog.fixed_gpu_machine_types(gpu.name)
    if machine is None:
        yield error("gpu.machine_type", f"{config.gpu.machine_type!r} is not a machine type gpuflow knows for GPUs",
                    f"use {'one of ' + str(fitting) if fitting else 'an n1-standard/highmem/highcpu or n1-custom type'}")
        return
    if machine.family not in gpu.families:
        yield error(
            "gpu.machine_type",
            f"{gpu.name} attaches only to {'/'.join(f.upper() for f in gpu.families)} machines, "
            f"not {machine.name} ({machine.family.upper()})",
            f"use one of {fitting}" if fitting else "use an N1 machine type, for example n1-standard-8",
        )
    elif machine.fixed_gpu is not None:
        if machine.fixed_gpu != gpu.name:
            yield error("gpu.machine_type", f"{machine.name} comes with {machine.fixed_gpu}, not {gpu.name}",
                        f"use one of {fitting}")
        elif machine.fixed_gpu_count != config.gpu.count:
            yield error(
                "gpu.count",
                f"{machine.name} has exactly {machine.fixed_gpu_count} {gpu.name} GPU(s), not {config.gpu.count}",
                f"set gpu.count: {machine.fixed_gpu_count}, or pick the {gpu.name} machine type with "
                f"{config.gpu.count} GPUs",
            )
    elif gpu.counts and config.gpu.count not in gpu.counts:
        yield error("gpu.count", f"{gpu.name} on N1 comes in counts {list(gpu.counts)}, not {config.gpu.count}",
                    f"set gpu.count to one of {list(gpu.counts)}")


def service_options_well_formed(config: GpuflowConfig) -> Iterator[Finding]:
    from gpuflow.gpu_options import PREFIX, AcceleratorOptionError, parse_worker_accelerator, worker_accelerator

    for option in config.dataflow_service_options:
        if not option.startswith(PREFIX):
            continue
        try:
            parsed = parse_worker_accelerator(option)
        except AcceleratorOptionError as problem:
            yield error("dataflow_service_options", str(problem),
                        f"remove it and let gpuflow build {worker_accelerator(config)} from gpu.*")
            continue
        if (parsed.type, parsed.count) != (config.gpu.type, config.gpu.count):
            yield error("dataflow_service_options",
                        f"{option} asks for {parsed.count} x {parsed.type} but gpu.* says "
                        f"{config.gpu.count} x {config.gpu.type}",
                        "remove the hand-written worker_accelerator; gpu.* is the one place to set the GPU")
        if not parsed.install_driver:
            yield error("dataflow_service_options", f"{option} does not install the NVIDIA driver",
                        "append ;install-nvidia-driver (the image must not carry a driver)")


def beam_version_for_gpu(config: GpuflowConfig) -> Iterator[Finding]:
    gpu = catalog.gpu_type(config.gpu.type)
    if gpu is None or gpu.min_beam is None:
        return
    beam = catalog.version_tuple(config.beam_version)
    if beam < catalog.version_tuple(gpu.min_beam):
        yield error("beam_version", f"{gpu.name} needs Beam >= {gpu.min_beam}, got {config.beam_version}",
                    f"set beam_version to {gpu.recommended_beam or gpu.min_beam} or later")
    elif gpu.recommended_beam and beam < catalog.version_tuple(gpu.recommended_beam):
        yield warning("beam_version", f"{gpu.name} works from Beam {gpu.min_beam} but is recommended from "
                      f"{gpu.recommended_beam}; got {config.beam_version}",
                      f"set beam_version to {gpu.recommended_beam} or later")


def container_cuda_for_gpu(config: GpuflowConfig) -> Iterator[Finding]:
    from gpuflow.containers import recipe_metadata

    gpu = catalog.gpu_type(config.gpu.type)
    try:
        recipe = recipe_metadata(config.container.recipe)
    except FileNotFoundError:
        yield error("container.recipe", f"recipe {config.container.recipe!r} does not exist",
                    "run `gpuflow preflight --recipes` for the names")
        return
    if gpu is not None and gpu.min_cuda and recipe.cuda_major < gpu.min_cuda:
        yield error(
            "container.recipe",
            f"{gpu.name} needs driver >= {gpu.min_driver or 'recent'} and CUDA >= {gpu.min_cuda}; recipe "
            f"{recipe.name} builds torch for CUDA {recipe.cuda_major}",
            f"use a CUDA {gpu.min_cuda} recipe such as l4 or beam_sdk_cuda",
        )
    if recipe.min_beam and catalog.version_tuple(config.beam_version) < catalog.version_tuple(recipe.min_beam):
        yield error("container.recipe", f"recipe {recipe.name} needs Beam >= {recipe.min_beam}",
                    f"set beam_version to {recipe.min_beam} or later, or use another recipe")


def _effective_dtype(config: GpuflowConfig) -> str:
    gpu = catalog.gpu_type(config.gpu.type)
    if config.model.dtype != "auto":
        return config.model.dtype
    return "bfloat16" if gpu is None or gpu.bf16 else "float32"


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


def _model_parameters_m(config: GpuflowConfig) -> float | None:
    if config.model.parameters_m:
        return config.model.parameters_m
    size = catalog.model_size(config.model.name)
    return size.parameters_m if size else None


def _model_memory_gb(config: GpuflowConfig) -> float | None:
    """Weights plus runtime overhead in the inference dtype; None when the model's size is unknown."""
    parameters_m = _model_parameters_m(config)
    if parameters_m is None:
        return None
    return parameters_m * 1e6 * catalog.bytes_per_parameter(_effective_dtype(config)) * catalog.runtime_overhead() / 1e9


def model_gpu_share(config: GpuflowConfig) -> float | None:
    """The share of one GPU's memory a model copy takes; None when the model or GPU is unknown."""
    gpu = catalog.gpu_type(config.gpu.type)
    needed_gb = _model_memory_gb(config)
    return None if gpu is None or needed_gb is None else needed_gb / gpu.memory_gb


def model_memory_fits(config: GpuflowConfig) -> Iterator[Finding]:
    gpu = catalog.gpu_type(config.gpu.type)
    machine = catalog.machine_spec(config.gpu.machine_type)
    parameters_m = _model_parameters_m(config)
    needed_gb = _model_memory_gb(config)
    share = model_gpu_share(config)
    if parameters_m is None or needed_gb is None:
        yield warning("model.parameters_m", f"the catalog does not know the size of {config.model.name}",
                      "set model.parameters_m so preflight can check GPU and worker memory")
        return
    if gpu is None or share is None:
        return
    dtype = _effective_dtype(config)
    numbers = f"{parameters_m:g}M parameters in {dtype} need about {needed_gb:.1f} GB; one {gpu.name} has {gpu.memory_gb} GB"
    if share > 1:
        yield error("gpu.type", f"the model does not fit: {numbers}",
                    "use a GPU with more memory (nvidia-a100-80gb), bfloat16, or a smaller model")
    elif share > SINGLE_PROCESS_SHARE:
        yield info("gpu.type", f"one model copy takes {share:.0%} of the GPU: {numbers}; with one SDK process per "
                   "vCPU each would load its own copy and run out of GPU memory",
                   "gpuflow launches with --experiments=no_use_multiple_sdk_containers (one process per worker)")
    elif machine is not None and machine.vcpus > 1 and share * machine.vcpus > 1:
        yield warning("gpu.machine_type", f"{machine.vcpus} SDK processes would share the GPU, one model copy each "
                      f"({numbers})", "enable NVIDIA MPS (use_nvidia_mps) or use no_use_multiple_sdk_containers")
    if machine is not None and needed_gb > machine.memory_gb * 0.8:
        yield error("gpu.machine_type", f"{machine.name} has {machine.memory_gb:g} GB of memory; loading the model "
                    f"needs about {needed_gb:.1f} GB on the worker too",
                    "use a machine type with more memory")


def region_offers_gpu(config: GpuflowConfig) -> Iterator[Finding]:
    offered = catalog.region_offers(config.region)
    if offered is None:
        yield warning("region", f"gpuflow's region table (as of {catalog.table_date('regions')}) does not know "
                      f"{config.region}", f"check that {config.region} offers {config.gpu.type} before launching")
    elif config.gpu.type not in offered:
        yield error("region", f"{config.region} does not offer {config.gpu.type} "
                    f"(table as of {catalog.table_date('regions')})",
                    f"use a region that offers it, or one of {offered} here")


def zone_not_pinned(config: GpuflowConfig) -> Iterator[Finding]:
    if config.gpu.zone and not config.gpu.zone.startswith(config.region):
        yield error("gpu.zone", f"zone {config.gpu.zone} is not in region {config.region}",
                    "leave gpu.zone empty (recommended) or pick a zone of the region")


GPU_RULES = [
    gpu_type_known,
    machine_type_fits_gpu,
    service_options_well_formed,
    beam_version_for_gpu,
    container_cuda_for_gpu,
    dtype_for_gpu,
    model_memory_fits,
    region_offers_gpu,
    zone_not_pinned,
]
