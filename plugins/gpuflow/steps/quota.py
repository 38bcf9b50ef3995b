"""check_quota: GPUs for count x max workers must be there before anything is created."""

from __future__ import annotations

import logging
from typing import Any

from gpuflow.config import GpuflowConfig
from gpuflow.platform import Platform

log = logging.getLogger(__name__)


class QuotaTooLow(RuntimeError):
    pass


def check_quota(config: GpuflowConfig, platform: Platform) -> dict[str, Any]:
    """gcp: the regional quota of the GPU's metric must cover the need. local: report this machine's GPUs."""
    capacity = platform.gpu_capacity()
    if config.profile == "local":
        if capacity["count"]:
            log.info("local GPUs: %s", capacity["gpus"])
        else:
            log.warning("no GPU on this machine (%s); the local profile runs inference on CPU",
                        capacity.get("note", "nvidia-smi lists none"))
        return capacity
    from gpuflow.quota import format_quota

    for reading in capacity["readings"]:
        log.info("GPU quota:\n%s", format_quota([_reading(reading)]))
        if not reading["enough"]:
            raise QuotaTooLow(
                f"{reading['region']}: {reading['metric']} quota is {reading['limit']:g} with {reading['usage']:g} in "
                f"use, so {reading['headroom']:g} free, but the job needs {reading['needed']} "
                f"({config.gpu.count} GPU(s) x {config.worker.max_num_workers} worker(s)). Fix: request more quota "
                "for that metric (IAM & Admin > Quotas), lower worker.max_num_workers, or use another region."
            )
    return capacity


def _reading(values: dict[str, Any]):
    from gpuflow.quota import QuotaReading

    return QuotaReading(values["region"], values["metric"], values["limit"], values["usage"], values["needed"])
