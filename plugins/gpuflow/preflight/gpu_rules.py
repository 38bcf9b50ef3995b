"""GPU readiness rules: what the Dataflow GPU guides say fails, checked before any worker starts.

Each rule reads the catalog (plugins/gpuflow/catalog/*.yaml), not if-chains.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

from gpuflow import catalog
from gpuflow.configuration.model import GpuflowConfig
from gpuflow.dataflow.gpu_options import (
    PREFIX,
    AcceleratorOptionError,
    model_parameters_m,
    parse_worker_accelerator,
    pipeline_machine_type,
    right_fitting,
    uses_prime,
    worker_accelerator,
)
from gpuflow.preflight.findings import Finding, error, info, warning
from gpuflow.preflight.memory_rules import (
    dtype_for_gpu,
    gpu_request_and_sharing,
    model_copies_need_their_sharing,
    model_memory_fits,
)


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
    elif (caps := catalog.n1_caps(gpu.name, config.gpu.count)) and (
            machine.vcpus > caps[0] or machine.memory_gb > caps[1]):
        yield error("gpu.machine_type", f"{machine.name} ({machine.vcpus} vCPUs, {machine.memory_gb:g} GB) is above "
                    f"what an N1 machine with {config.gpu.count} {gpu.name} may have: {caps[0]} vCPUs and "
                    f"{caps[1]} GB", f"use an N1 machine type within those, e.g. n1-standard-{min(caps[0], 8)}")


def service_options_well_formed(config: GpuflowConfig) -> Iterator[Finding]:

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


def custom_machine_valid(config: GpuflowConfig) -> Iterator[Finding]:
    """N1 custom types: 1 or an even number of vCPUs, memory in 256 MB steps, 0.9 to 6.5 GB a vCPU unless -ext."""
    found = re.fullmatch(r"(?:n1-)?custom-(\d+)-(\d+)(-ext)?", config.gpu.machine_type)
    if not found:
        return
    vcpus, memory_mb, extended = int(found.group(1)), int(found.group(2)), bool(found.group(3))
    name = config.gpu.machine_type
    if vcpus != 1 and vcpus % 2:
        yield error("gpu.machine_type", f"{name}: an N1 custom type has 1 or an even number of vCPUs",
                    f"use n1-custom-{vcpus + 1}-{memory_mb} or n1-custom-1-...")
    if memory_mb % 256:
        yield error("gpu.machine_type", f"{name}: custom memory must be a multiple of 256 MB",
                    f"use n1-custom-{vcpus}-{(memory_mb // 256 + 1) * 256}{'-ext' if extended else ''}")
    per_vcpu_gb = memory_mb / 1024 / vcpus
    if per_vcpu_gb < 0.9:
        yield error("gpu.machine_type", f"{name}: {per_vcpu_gb:.2f} GB a vCPU is below N1's 0.9 GB",
                    "give the custom type more memory")
    elif per_vcpu_gb > 6.5 and not extended:
        yield error("gpu.machine_type", f"{name}: {per_vcpu_gb:.1f} GB a vCPU needs extended memory",
                    f"append -ext: n1-custom-{vcpus}-{memory_mb}-ext")


def streaming_right_fitting_autoscales(config: GpuflowConfig) -> Iterator[Finding]:
    """Right fitting on a streaming pipeline needs horizontal autoscaling and an experiment.

    docs.cloud.google.com/dataflow/docs/guides/right-fitting: "Right fitting is supported with streaming pipelines
    with horizontal autoscaling enabled. You can enable it by setting the --experiments=enable_streaming_rightfitting
    pipeline option." gpuflow sends that experiment with every streaming job in resource_hint mode, on Streaming
    Engine, which autoscales horizontally between one worker and worker.max_num_workers.
    """
    if not right_fitting(config):  # (CPU workers: cpu_workers refuses the hint)
        return
    if config.worker.max_num_workers <= 1:
        yield error("worker.max_num_workers", "right fitting (gpu.request: resource_hint) on a streaming pipeline "
                    "needs horizontal autoscaling, and worker.max_num_workers 1 leaves nothing to scale",
                    "set worker.max_num_workers to 2 or more, or use gpu.request: worker_accelerator")
    if "disable_streaming_engine" in config.dataflow.experiments:
        yield error("dataflow.experiments", "right fitting on a streaming pipeline needs horizontal autoscaling, "
                    "which needs Streaming Engine", "remove disable_streaming_engine from dataflow.experiments")
    yield info("gpu.request", "a streaming job with right fitting needs --experiments=enable_streaming_rightfitting "
               "(Dataflow's right-fitting page)", "gpuflow sends it with the job")


def right_fitting_machine_types(config: GpuflowConfig) -> Iterator[Finding]:
    """resource_hint: the GPU's machine type goes inside the hint; the pipeline's machine type is a CPU machine for
    the steps without it, or none at all with Dataflow Prime, which does not support --machine_type for Python
    pipelines (docs.cloud.google.com/dataflow/docs/guides/enable-dataflow-prime, "Unsupported features")."""
    if not right_fitting(config):
        return
    if uses_prime(config):
        if config.worker.machine_type:
            yield error("worker.machine_type", "Dataflow Prime does not support designating VM types with "
                        "--machine_type for Python pipelines, and dataflow_service_options has enable_prime",
                        "leave worker.machine_type empty (Prime picks the workers), or drop enable_prime")
        yield info("worker.machine_type", "with Dataflow Prime no machine type is sent; Prime picks the workers of "
                   "the steps without the GPU hint", f"the hint still names {config.gpu.machine_type} for RunInference")
        return
    machine_type = pipeline_machine_type(config) or ""
    if machine_type.split("-", 1)[0] in GPU_MACHINE_FAMILIES:
        yield error("worker.machine_type", f"{machine_type} is a GPU machine type; the steps without the GPU hint "
                    "would run on it, each VM billed for its GPUs",
                    f"set worker.machine_type to a CPU machine type, e.g. "
                    f"{catalog.cpu_worker_machine_for(config.model.name, model_parameters_m(config))}")
    else:
        yield info("worker.machine_type", f"the steps without the GPU hint run on {machine_type}; RunInference runs "
                   f"on {config.gpu.machine_type} with {config.gpu.count} x {config.gpu.type}",
                   "set worker.machine_type to choose the CPU machine")


ZonesOffering = Callable[[str, str], list[str]]


def region_offers_gpu_now(config: GpuflowConfig, zones_offering: ZonesOffering) -> Iterator[Finding]:
    """Ask Compute Engine which zones of the region offer the GPU type; the table is the offline fallback."""
    try:
        zones = zones_offering(config.gpu.type, config.region)
    except Exception as problem:  # no permission, no network: fall back to the table, and say so
        yield warning("region", f"could not ask Compute Engine which zones of {config.region} offer "
                      f"{config.gpu.type} ({type(problem).__name__}: {problem}); using gpuflow's table instead",
                      "grant compute.acceleratorTypes.list to the Airflow identity, or check the region by hand")
        yield from region_offers_gpu(config)
        return
    if not zones:
        yield error("region", f"Compute Engine lists no zone of {config.region} that offers {config.gpu.type}",
                    "use another region (gcloud compute accelerator-types list --filter="
                    f"\"name={config.gpu.type}\" lists them), or another gpu.type")
    else:
        yield info("region", f"Compute Engine: {config.gpu.type} is offered in {', '.join(zones)}",
                   "leave gpu.zone empty so Dataflow can pick among them")


def region_offers_gpu(config: GpuflowConfig) -> Iterator[Finding]:
    """The offline table (transcribed by hand; on gcp, preflight asks Compute Engine instead)."""
    offered = catalog.region_offers(config.region)
    if offered is None:
        yield warning("region", f"gpuflow's region table (as of {catalog.table_date('regions')}) does not know "
                      f"{config.region}", f"check that {config.region} offers {config.gpu.type} before launching")
    elif config.gpu.type not in offered and not catalog.regions_offering(config.gpu.type):
        # The table lists this GPU in no region at all (it lags Google's offer: nvidia-h100-mega-80gb was added to the
        # GPU table first), so it can say nothing of it: a warning. On gcp the run's preflight asks Compute Engine.
        yield warning("region", f"gpuflow's offline region table (as of {catalog.table_date('regions')}) lists "
                      f"{config.gpu.type} in no region", f"check that {config.region} offers {config.gpu.type} "
                      f"(gcloud compute accelerator-types list --filter=\"name={config.gpu.type} AND "
                      f"zone~{config.region}\")")
    elif config.gpu.type not in offered:
        yield error("region", f"{config.region} does not offer {config.gpu.type} "
                    f"(table as of {catalog.table_date('regions')})",
                    f"use a region that offers it, or one of {offered} here")


def zone_not_pinned(config: GpuflowConfig) -> Iterator[Finding]:
    if config.gpu.zone and not config.gpu.zone.startswith(config.region):
        yield error("gpu.zone", f"zone {config.gpu.zone} is not in region {config.region}",
                    "leave gpu.zone empty (recommended) or pick a zone of the region")


#: Machine families whose machine types come with GPUs (g2, a2, a3): no place for CPU workers.
GPU_MACHINE_FAMILIES = {"g2", "a2", "a3"}


def cpu_workers(config: GpuflowConfig) -> Iterator[Finding]:
    """gpu.type none: guide 002's pipeline on CPU workers, sized by its table of n2-highmem machine types."""
    size = catalog.model_size(config.model.name)
    if size is not None and size.cpu_worker_machine is None:  # no guide row for this model on CPU workers
        size = None
    guide = f"guide 002 runs {config.model.name} on {size.cpu_worker_machine}" if size else None
    if config.require_gpu:
        yield error("require_gpu", "gpu.type none runs on CPU workers, which never see a GPU",
                    "set require_gpu: false, or set a gpu.type")
    if config.gpu.request == "resource_hint":
        yield error("gpu.request", "right fitting with gpu.type none has no accelerator to hint",
                    "set gpu.request: worker_accelerator (with gpu.type none, no accelerator is asked for)")
    if config.gpu.sharing == "mps":
        yield error("gpu.sharing", "NVIDIA MPS needs a GPU", "set gpu.sharing: auto")
    machine = catalog.machine_spec(config.gpu.machine_type)
    if machine is not None and machine.family in GPU_MACHINE_FAMILIES:
        yield error("gpu.machine_type", f"{machine.name} is a GPU machine type ({machine.family.upper()}), billed for "
                    "its GPUs", f"set gpu.machine_type: {size.cpu_worker_machine if size else 'n2-highmem-4'}"
                    + (f" ({guide})" if guide else ""))
    elif size is not None and guide and config.gpu.machine_type != size.cpu_worker_machine:
        yield info("gpu.machine_type", f"{guide}; this run uses {config.gpu.machine_type}",
                   f"set gpu.machine_type: {size.cpu_worker_machine} for the guide's sizing")


#: The rules that apply with gpu.type none, in place of GPU_RULES.
CPU_RULES = [cpu_workers, zone_not_pinned]

GPU_RULES = [
    gpu_type_known,
    machine_type_fits_gpu,
    service_options_well_formed,
    beam_version_for_gpu,
    dtype_for_gpu,
    model_memory_fits,
    custom_machine_valid,
    gpu_request_and_sharing,
    model_copies_need_their_sharing,
    right_fitting_machine_types,
    region_offers_gpu,
    zone_not_pinned,
]
