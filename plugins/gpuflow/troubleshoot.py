"""From a failed job's error text to its cause and fix, and the fallback plan for exhausted zones.

The patterns are the symptoms the Dataflow GPU troubleshooting guide lists, as they appear in Dataflow
job messages, worker logs and Beam's own log lines.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from gpuflow.config import GpuflowConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Diagnosis:
    code: str
    cause: str
    fix: str
    try_fallback: bool = False


_SYMPTOMS: list[tuple[str, re.Pattern[str], str, str, bool]] = [
    ("ZONE_RESOURCE_POOL_EXHAUSTED",
     re.compile(r"ZONE_RESOURCE_POOL_EXHAUSTED(_WITH_DETAILS)?|does not have enough resources available", re.I),
     "the zone has no free GPUs of this type right now (a stock-out, not a quota problem)",
     "leave gpu.zone empty so Dataflow can pick another zone, add gpu.fallbacks (another region or GPU type), "
     "or try again later", True),
    ("QUOTA_EXCEEDED",
     re.compile(r"QUOTA_EXCEEDED|Quota '([A-Z0-9_]+)' exceeded", re.I),
     "the project's regional GPU quota is smaller than gpu.count x worker.max_num_workers",
     "request more quota for the GPU metric in the region (IAM & Admin > Quotas), or lower "
     "worker.max_num_workers; `gpu_quota_report` shows the headroom", False),
    ("PYTHON_MISMATCH",
     re.compile(r"SystemError: unknown opcode", re.I),
     "the launch environment and the worker container run different Python minor versions",
     "build the container with the launcher's Python (python_version) or launch from the container's Python",
     False),
    ("PICKLER_MISMATCH",
     re.compile(r"UnpicklingError|PicklingError|Can't get attribute '[^']+' on <module|"
                r"code\(\) argument \d+ must be|Could not (de)?serialize", re.I),
     "the pipeline was pickled by a launcher whose Beam, dill/cloudpickle or Python differs from the container's",
     "use the same Beam version (beam_version) and Python minor version in the launch environment and image",
     False),
    ("GPU_OUT_OF_MEMORY",
     re.compile(r"CUDA out of memory|cudaErrorMemoryAllocation|CUDA error: out of memory|OutOfMemoryError", re.I),
     "the model copies and batches do not fit in the GPU's memory",
     "use one SDK process per worker (--experiments=no_use_multiple_sdk_containers), lower "
     "inference.max_batch_size, use bfloat16, or a GPU with more memory", False),
    ("MISSING_BOOT_ENTRYPOINT",
     re.compile(r"/opt/apache/beam/boot: no such file|exec: \"/opt/apache/beam/boot\"|"
                r"failed to \\?\"StartContainer\\?\".*CrashLoopBackOff", re.I),
     "the worker container cannot start the Beam SDK harness",
     "copy /opt/apache/beam from apache/beam_pythonX.Y_sdk into the image and set "
     'ENTRYPOINT ["/opt/apache/beam/boot"] (every gpuflow recipe does)', False),
    ("WORKERS_NEVER_STARTED",
     re.compile(r"no worker activity has been seen|workers? (failed to|did not|never) start|"
                # "... in zone us-central1-a failed ..." or, region-wide, "... in us-central1 failed ..."
                r"Startup of the worker pool in (zone )?\S+ failed to bring up any of the desired", re.I),
     "the workers never came up: usually the image (too large for the disk, wrong entrypoint) or the driver",
     "set worker.disk_size_gb to 50 or more, check the image with `gpuflow debug-vm`, and read the worker "
     "startup logs", False),
    ("SHIELDED_VM_REQUIRED",
     re.compile(r"constraints/compute\.requireShieldedVm", re.I),
     "the organisation policy constraints/compute.requireShieldedVm blocks accelerated Dataproc Serverless batches",
     "ask an organisation admin to exempt the project from constraints/compute.requireShieldedVm, or run the "
     "batch in a project outside that policy", False),
    ("NO_GPU_USAGE",
     re.compile(r"failed to detect GPUs with your setup|GPUs are not available\. Switching to CPU|"
                r"cuda_available\W+false", re.I),
     "the workers run without a GPU: no accelerator attached, no driver installed, or a CPU build of torch",
     "send worker_accelerator=type:...;count:...;install-nvidia-driver (gpuflow builds it from gpu.*), use a "
     "CUDA build of torch in the image, and set require_gpu: true to fail instead of paying for idle GPUs", False),
]


def classify(text: str) -> Diagnosis | None:
    """The first known symptom in ``text``; None when nothing matches."""
    for code, pattern, cause, fix, try_fallback in _SYMPTOMS:
        if pattern.search(text):
            return Diagnosis(code, cause, fix, try_fallback)
    return None


def fallback_configs(config: GpuflowConfig) -> list[GpuflowConfig]:
    """The configured fallbacks as whole configurations, in order."""
    configs = []
    for fallback in config.gpu.fallbacks:
        candidate = config.model_copy(deep=True)
        if fallback.region:
            candidate.region = fallback.region
        if fallback.type:
            candidate.gpu.type = fallback.type
        if fallback.machine_type:
            candidate.gpu.machine_type = fallback.machine_type
        candidate.gpu.fallbacks = []
        configs.append(candidate)
    return configs


class FallbacksExhausted(RuntimeError):
    pass


@dataclass(frozen=True)
class Placement:
    """One place to start the GPU workers: the configuration itself (number 1) or one of its fallbacks."""

    number: int
    total: int
    config: GpuflowConfig

    @property
    def label(self) -> str:
        gpu = self.config.gpu
        return f"attempt {self.number}/{self.total}: {gpu.count} x {gpu.type} on {gpu.machine_type} in {self.config.region}"


def next_placement(config: GpuflowConfig, after: int, failures: list[str]) -> Placement:
    """The first placement after number ``after`` (0: start with the configuration itself) that preflight accepts.

    Every fallback is re-checked by preflight's configuration rules first; one with errors is skipped and noted in
    ``failures``. When none is left, FallbacksExhausted says what each attempt met."""
    from gpuflow.preflight import format_findings, has_errors, run_preflight

    candidates = [config, *fallback_configs(config)]
    for number in range(after + 1, len(candidates) + 1):
        placement = Placement(number, len(candidates), candidates[number - 1])
        if number > 1:
            findings = run_preflight(placement.config, check_environment=False)
            if has_errors(findings):
                log.warning("%s skipped, preflight refuses it:\n%s", placement.label, format_findings(findings))
                failures.append(f"{placement.label}: refused by preflight")
                continue
        log.info("%s", placement.label)
        return placement
    raise FallbacksExhausted(
        "no configuration could get GPUs: " + "; ".join(failures)
        + ". Fix: add gpu.fallbacks (other regions or GPU types) or try again later."
    )


def worth_a_fallback(placement: Placement, error_text: str, failures: list[str]) -> bool:
    """True when the failure is one another placement can fix (an exhausted zone); it is noted in ``failures``."""
    diagnosis = classify(error_text)
    if diagnosis is None or not diagnosis.try_fallback:
        return False
    log.warning("%s failed with %s: %s", placement.label, diagnosis.code, diagnosis.cause)
    failures.append(f"{placement.label}: {diagnosis.code}")
    return True
