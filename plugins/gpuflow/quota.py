"""GPU capacity: Compute Engine regional quota and usage (gcp), or the GPUs of this machine (local)."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

from gpuflow import catalog
from gpuflow.config import GpuflowConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class QuotaReading:
    region: str
    metric: str
    limit: float
    usage: float
    needed: int

    @property
    def headroom(self) -> float:
        return self.limit - self.usage

    @property
    def enough(self) -> bool:
        return self.headroom >= self.needed

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "headroom": self.headroom, "enough": self.enough}


def quota_regions(config: GpuflowConfig) -> list[str]:
    """The configured region, then every fallback region, each once."""
    regions = [config.region, *(f.region for f in config.gpu.fallbacks if f.region)]
    return list(dict.fromkeys(regions))


def gpus_needed(config: GpuflowConfig) -> int:
    return config.gpu.count * config.worker.max_num_workers


def regions_client(conn_id: str):
    """A Compute Engine RegionsClient with the Airflow connection's credentials."""
    from airflow.providers.google.common.hooks.base_google import GoogleBaseHook
    from google.cloud import compute_v1

    return compute_v1.RegionsClient(credentials=GoogleBaseHook(gcp_conn_id=conn_id).get_credentials())


def regional_gpu_quota(config: GpuflowConfig, client, regions: list[str] | None = None) -> list[QuotaReading]:
    """Read the GPU metric's regional quota and usage; a region without the metric has a limit of 0."""
    from google.cloud import compute_v1

    gpu = catalog.gpu_type(config.gpu.type)
    if gpu is None:
        raise ValueError(f"gpu.type {config.gpu.type!r} is unknown. Fix: run `gpuflow preflight` first.")
    readings = []
    for region in regions or quota_regions(config):
        answer = client.get(request=compute_v1.GetRegionRequest(project=config.project, region=region))
        quota = next((q for q in answer.quotas if q.metric == gpu.quota_metric), None)
        readings.append(QuotaReading(region, gpu.quota_metric, quota.limit if quota else 0.0,
                                     quota.usage if quota else 0.0, gpus_needed(config)))
    return readings


def format_quota(readings: list[QuotaReading]) -> str:
    lines = [f"{'REGION':<24} {'METRIC':<24} {'LIMIT':>6} {'USAGE':>6} {'FREE':>6} {'NEEDED':>6}  STATUS"]
    for r in readings:
        status = "ok" if r.enough else "NOT ENOUGH"
        lines.append(f"{r.region:<24} {r.metric:<24} {r.limit:>6g} {r.usage:>6g} {r.headroom:>6g} {r.needed:>6}  {status}")
    return "\n".join(lines)


def local_gpu_report(config: GpuflowConfig) -> dict[str, Any]:
    """What this machine offers: nvidia-smi's listing and torch's view. Says plainly when there is none."""
    from gpuflow.platform.local import LocalPlatform

    report = LocalPlatform(config).gpu_capacity()
    try:
        import torch

        report["torch_cuda_devices"] = torch.cuda.device_count()
    except ImportError:
        report["torch_cuda_devices"] = None
    report["needed"] = config.gpu.count
    report["enough"] = max(report["count"], report["torch_cuda_devices"] or 0) >= config.gpu.count
    return report
