"""verify_gpu: ask the workers themselves whether they see a GPU."""

from __future__ import annotations

import logging
from typing import Any

from gpuflow.config import GpuflowConfig
from gpuflow.naming import ResourceNames
from gpuflow.platform import Platform

log = logging.getLogger(__name__)


def verify_gpu(config: GpuflowConfig, names: ResourceNames, platform: Platform, image: str) -> dict[str, Any]:
    report = platform.run_gpu_check(names, image)
    if report.get("gpu_found"):
        log.info("the workers see a GPU: %s", report.get("torch", {}).get("devices"))
    else:
        # With require_gpu the check pipeline itself fails; here the run goes on, on CPU.
        log.warning("NO GPU found on the workers (%s); require_gpu is false, so inference runs on CPU",
                    "; ".join(report.get("errors", [])) or "no GPU framework installed")
    return report
