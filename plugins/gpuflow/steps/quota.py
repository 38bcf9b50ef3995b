"""check_quota: GPUs for count x max workers must be there before anything is created."""

from __future__ import annotations

import logging
from typing import Any

from gpuflow.configuration.model import GpuflowConfig
from gpuflow.platform import GpuBackend
from gpuflow.platform.local import LocalPlatform

log = logging.getLogger(__name__)


class QuotaTooLow(RuntimeError):
    pass


def check_quota(config: GpuflowConfig, platform: GpuBackend) -> dict[str, Any]:
    """gcp: the regional quota of the GPU's metric must cover the need. local: report this machine's GPUs."""
    if not config.uses_gpu:
        log.info("gpu.type none: CPU workers, so no GPU quota to check")
        return {"source": "none", "readings": [], "enough": True, "note": "gpu.type none: CPU workers"}
    capacity = platform.gpu_capacity()
    if not config.traits.gpu_quota:  # this machine's GPUs
        if capacity["count"]:
            log.info("local GPUs: %s", capacity["gpus"])
        else:
            log.warning("no GPU on this machine (%s); the local profile runs inference on CPU",
                        capacity.get("note", "nvidia-smi lists none"))
        return capacity
    from gpuflow.gpus.quota import QuotaReading, format_quota

    readings = [QuotaReading(**{key: reading[key] for key in QuotaReading.__dataclass_fields__})
                for reading in capacity["readings"]]
    log.info("GPU quota:\n%s", format_quota(readings))
    for reading in readings:
        if not reading.known:
            log.warning("%s %s: unknown, so it cannot be checked before the launch. Fix: %s", reading.region,
                        reading.metric, reading.fix)
        elif reading.enough is None:
            log.warning("%s %s: the limit (%g) covers the job, but the usage is unknown (%s)", reading.region,
                        reading.metric, reading.limit, reading.fix)
        elif reading.enough is False:
            in_use = "" if reading.usage is None else f" with {reading.usage:g} in use, so {reading.headroom:g} free"
            raise QuotaTooLow(
                f"{reading.region}: {reading.metric} quota is {reading.limit:g}{in_use}, but the job needs {reading.needed} "
                f"({config.gpu.count} GPU(s) x {config.worker.max_num_workers} worker(s)). Fix: request more quota "
                "for that metric (IAM & Admin > Quotas), lower worker.max_num_workers, or use another region."
            )
    return capacity


def local_gpu_report(config: GpuflowConfig) -> dict[str, Any]:
    """What this machine offers: nvidia-smi's listing and torch's view. Says plainly when there is none."""
    report = LocalPlatform(config).gpu_capacity()
    try:
        import torch

        report["torch_cuda_devices"] = torch.cuda.device_count()
    except ImportError:
        report["torch_cuda_devices"] = None
    report["needed"] = config.gpu.count
    report["enough"] = max(report["count"], report["torch_cuda_devices"] or 0) >= config.gpu.count
    return report
