"""verify_gpu: ask the workers themselves whether they see a GPU (the platform starts the check; this judges it)."""

from __future__ import annotations

import logging
from typing import Any

from gpuflow.configuration.model import GpuflowConfig

log = logging.getLogger(__name__)


class NoGpuOnWorkers(RuntimeError):
    pass


def judge_gpu_report(config: GpuflowConfig, report: dict[str, Any]) -> dict[str, Any]:
    """The GPU check's report, judged. On Google Cloud a worker without a GPU is always an error: it bills for a
    GPU it cannot use."""
    if report.get("gpu_found"):
        log.info("the workers see a GPU: %s", report.get("torch", {}).get("devices"))
        return report
    reasons = "; ".join(report.get("errors", [])) or "no GPU framework installed"
    if config.traits.gpus_billed or config.require_gpu:
        raise NoGpuOnWorkers(
            f"the workers see no GPU ({reasons}). Fix: check that worker_accelerator carries "
            "install-nvidia-driver, that gpu.machine_type fits gpu.type, and that the image has a CUDA build of torch "
            "(`gpuflow debug-vm` runs the image on a GPU VM)."
        )
    log.warning("NO GPU found on the workers (%s); require_gpu is false, so inference runs on CPU", reasons)
    return report
