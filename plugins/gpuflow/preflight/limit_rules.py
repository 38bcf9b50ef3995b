"""The site's limits (``limits.*``, set in the configuration file only) and the run's worst-case cost per hour.

Preflight logs what the run's main job would cost at its peak (its workers or executors at on-demand list prices,
``catalog/prices.yaml``), marking each figure the catalog does not hold, and refuses a run over a limit before
anything is created. A limit that needs a figure the catalog lacks refuses the run as not checked: it never passes on
nothing."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from gpuflow.catalog import machine_price, machine_spec
from gpuflow.configuration.model import GpuflowConfig
from gpuflow.preflight.findings import Finding, error, info

#: The workflows whose main job is a Dataflow job, and the one whose is a Dataproc batch.
DATAFLOW_WORKFLOWS = ("inference", "batch")
DATAPROC_WORKFLOW = "dataproc"

#: The settings that say how often gpuflow polls Google (or the emulators), each a job's own.
POLL_INTERVALS = ("dataflow.poll_interval_s", "dataproc.poll_interval_s", "batch.input_poll_interval_s",
                  "deployment.refresh_interval_s")
#: The waits that keep a job running during a run, bounded by limits.max_job_hours.
JOB_DURATIONS = ("batch.job_timeout_s", "dataproc.timeout_s", "smoke_test.timeout_s", "deployment.rollout_timeout_s",
                 "batch.input_wait_s")


@dataclass(frozen=True)
class CostEstimate:
    """A job's peak: how many machines of which type, its GPUs, and its price per hour where the catalog has it."""

    what: str  # e.g. "4 x g2-standard-4 (Dataflow workers)"
    gpus: int
    usd_per_hour: float | None
    unread: tuple[str, ...]  # the figures the catalog does not hold
    source: str = ""


def _value(config: GpuflowConfig, dotted: str) -> object:
    node: object = config
    for part in dotted.split("."):
        node = getattr(node, part, None)
    return node


def estimate(config: GpuflowConfig, workflow: str) -> CostEstimate | None:
    """The run's main job at its peak; None for a workflow that starts none (the janitor, the teardown, reports)."""
    if workflow in DATAFLOW_WORKFLOWS:
        workers = config.worker.max_num_workers
        machine = config.gpu.machine_type if config.uses_gpu else (config.worker.machine_type or
                                                                   config.gpu.machine_type)
        gpus = workers * config.gpu.count if config.uses_gpu else 0
        unread = []
        price = machine_price(config.region, machine)
        if price is None:
            unread.append(f"{machine} in {config.region}")
        spec = machine_spec(machine)
        if config.uses_gpu and not (spec and spec.fixed_gpu):  # an N1 machine: its GPUs are billed apart
            unread.append(f"{config.gpu.type} attached to {machine} in {config.region}")
        total = None if unread or price is None else workers * price.usd_per_hour
        return CostEstimate(f"{workers} x {machine} (Dataflow workers at their peak)", gpus, total, tuple(unread),
                            price.source if price else "")
    if workflow == DATAPROC_WORKFLOW and config.dataproc is not None:
        executors = config.dataproc.executor_instances
        return CostEstimate(f"{executors} Dataproc Serverless executors ({config.dataproc.accelerator}, one GPU each)",
                            executors, None,
                            (f"Dataproc Serverless DCUs and {config.dataproc.accelerator} accelerators in "
                             f"{config.region}",))
    return None


def _shown(estimate_: CostEstimate) -> str:
    if estimate_.usd_per_hour is None:
        return f"{estimate_.what}: not read ({'; '.join(estimate_.unread)} is not in catalog/prices.yaml)"
    return (f"{estimate_.what}: ${estimate_.usd_per_hour:.2f} per hour at on-demand list prices "
            f"({estimate_.source})")


def limit_findings(config: GpuflowConfig, workflow: str) -> Iterator[Finding]:
    """The run against the site's limits, and its cost estimate (logged, as info)."""
    limits = config.limits
    fix_limits = "or raise the limit in the configuration file (docs/security.md)"
    for dotted in POLL_INTERVALS:
        value = _value(config, dotted)
        if isinstance(value, int | float) and value < limits.min_poll_interval_s:
            yield error(dotted, f"{value} s is shorter than limits.min_poll_interval_s "
                        f"({limits.min_poll_interval_s} s)", f"set {dotted} to {limits.min_poll_interval_s} or more")
    if limits.max_job_hours is not None:
        bound_s = limits.max_job_hours * 3600
        for dotted in JOB_DURATIONS:
            value = _value(config, dotted)
            if isinstance(value, int | float) and value > bound_s:
                yield error(dotted, f"{value:g} s is longer than limits.max_job_hours ({limits.max_job_hours:g} h)",
                            f"set {dotted} to {bound_s:g} or less, {fix_limits}")
    persistent = workflow == "inference" and config.deployment.mode == "persistent"
    if persistent and limits.lasting_deployments is False:
        yield error("deployment.mode", "this site allows no lasting deployment (limits.lasting_deployments: false)",
                    "set deployment.mode to ephemeral")
    if persistent and limits.max_job_hours is not None:
        yield error("deployment.mode", "a lasting deployment runs until it is torn down, and limits.max_job_hours "
                    f"({limits.max_job_hours:g} h) bounds every job", "set deployment.mode to ephemeral, or remove "
                    "limits.max_job_hours from the configuration file")
    gpu_type = (config.dataproc.accelerator if workflow == DATAPROC_WORKFLOW and config.dataproc
                else config.gpu.type if config.uses_gpu else None)
    if limits.regions and config.region not in limits.regions:
        yield error("region", f"{config.region} is not among the regions this site allows "
                    f"({', '.join(limits.regions)})", f"pick one of them, {fix_limits}")
    if gpu_type and limits.gpu_types and gpu_type not in limits.gpu_types:
        yield error("gpu.type", f"{gpu_type} is not among the GPU types this site allows "
                    f"({', '.join(limits.gpu_types)})", f"pick one of them, {fix_limits}")
    if workflow == DATAPROC_WORKFLOW and config.dataproc and limits.max_dataproc_executors is not None \
            and config.dataproc.executor_instances > limits.max_dataproc_executors:
        yield error("dataproc.executor_instances", f"{config.dataproc.executor_instances} executors is above "
                    f"limits.max_dataproc_executors ({limits.max_dataproc_executors})",
                    f"ask for {limits.max_dataproc_executors} or fewer, {fix_limits}")
    peak = estimate(config, workflow)
    if peak is None:
        return
    yield info("cost", f"worst case: {_shown(peak)}; {peak.gpus} GPUs at the peak",
               "an estimate at Compute Engine list prices: Dataflow and Dataproc bill at their own rates")
    if limits.max_gpus is not None and peak.gpus > limits.max_gpus:
        yield error("limits.max_gpus", f"{peak.what} holds {peak.gpus} GPUs at its peak, above limits.max_gpus "
                    f"({limits.max_gpus})", f"lower worker.max_num_workers or gpu.count, {fix_limits}")
    if limits.max_usd_per_hour is not None:
        if peak.usd_per_hour is None:
            yield error("limits.max_usd_per_hour", f"not checked: {_shown(peak)}, so limits.max_usd_per_hour "
                        f"(${limits.max_usd_per_hour:g}) cannot be applied",
                        "pick a machine type and region catalog/prices.yaml prices, or add its figure there with "
                        "its source")
        elif peak.usd_per_hour > limits.max_usd_per_hour:
            yield error("limits.max_usd_per_hour", f"{_shown(peak)}, above limits.max_usd_per_hour "
                        f"(${limits.max_usd_per_hour:g})", f"lower worker.max_num_workers or pick a cheaper "
                        f"machine, {fix_limits}")
