"""GPU capacity: Compute Engine regional quota and usage (gcp), or the GPUs of this machine (local)."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

from gpuflow import catalog
from gpuflow.config import GpuflowConfig

log = logging.getLogger(__name__)


#: The project-wide quota that bounds every GPU in every region, on top of each region's GPU metric. Compute
#: Engine reports it among the project's quotas (`gcloud compute project-info describe`, quotas[].metric;
#: cloud.google.com/compute/resource-usage, "GPU quota").
GLOBAL_GPU_METRIC = "GPUS_ALL_REGIONS"


@dataclass(frozen=True)
class QuotaReading:
    """One quota against what the job needs. ``limit`` None: the API did not report the metric (unknown)."""

    region: str  # a region, or "global" for the project-wide GPUS_ALL_REGIONS
    metric: str
    limit: float | None
    usage: float | None
    needed: int
    fix: str = ""

    @property
    def known(self) -> bool:
        return self.limit is not None

    @property
    def headroom(self) -> float | None:
        return None if self.limit is None else self.limit - (self.usage or 0.0)

    @property
    def enough(self) -> bool | None:
        return None if self.headroom is None else self.headroom >= self.needed

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "headroom": self.headroom, "enough": self.enough, "known": self.known}


def quota_regions(config: GpuflowConfig) -> list[str]:
    """The configured region, then every fallback region, each once."""
    regions = [config.region, *(f.region for f in config.gpu.fallbacks if f.region)]
    return list(dict.fromkeys(regions))


def gpus_needed(config: GpuflowConfig) -> int:
    return config.gpu.count * config.worker.max_num_workers


class ComputeClients(NamedTuple):
    regions: Any
    projects: Any
    accelerator_types: Any


def compute_clients(conn_id: str) -> ComputeClients:
    """Compute Engine's Regions, Projects and AcceleratorTypes clients with the Airflow connection's credentials.

    Gap in the Airflow Google provider: its ComputeEngineHook reads neither quotas nor accelerator types."""
    from airflow.providers.google.common.hooks.base_google import GoogleBaseHook
    from google.cloud import compute_v1

    credentials = GoogleBaseHook(gcp_conn_id=conn_id).get_credentials()
    return ComputeClients(compute_v1.RegionsClient(credentials=credentials),
                          compute_v1.ProjectsClient(credentials=credentials),
                          compute_v1.AcceleratorTypesClient(credentials=credentials))


def zones_offering(project: str, gpu_type: str, region: str, client) -> list[str]:
    """The zones of the region that offer the GPU type, as Compute Engine lists its accelerator types now
    (acceleratorTypes.aggregatedList, filtered by name)."""
    from google.cloud import compute_v1

    pager = client.aggregated_list(request=compute_v1.AggregatedListAcceleratorTypesRequest(
        project=project, filter=f'name = "{gpu_type}"'))
    return sorted(scope.removeprefix("zones/") for scope, listed in pager
                  if scope.startswith(f"zones/{region}-") and any(a.name == gpu_type for a in listed.accelerator_types))


def _unknown_fix(gpu, region: str) -> str:
    if gpu.quota_note:
        return gpu.quota_note
    return (f"Compute Engine reported no {gpu.quota_metric} quota for {region}: check the region offers "
            f"{gpu.name} and read the quota in IAM & Admin > Quotas")


def regional_gpu_quota(config: GpuflowConfig, client, regions: list[str] | None = None) -> list[QuotaReading]:
    """The GPU's regional quota and usage; a metric the API does not report is unknown, never a limit of 0."""
    from google.cloud import compute_v1

    gpu = catalog.gpu_type(config.gpu.type)
    if gpu is None:
        raise ValueError(f"gpu.type {config.gpu.type!r} is unknown. Fix: run `gpuflow preflight` first.")
    readings = []
    for region in regions or quota_regions(config):
        quota = None
        if gpu.quota_metric:
            answer = client.get(request=compute_v1.GetRegionRequest(project=config.project, region=region))
            quota = next((q for q in answer.quotas if q.metric == gpu.quota_metric), None)
        readings.append(QuotaReading(region, gpu.quota_metric or f"{gpu.name} (per GPU family)",
                                     quota.limit if quota else None, quota.usage if quota else None,
                                     gpus_needed(config), "" if quota else _unknown_fix(gpu, region)))
    return readings


def global_gpu_quota(config: GpuflowConfig, projects_client) -> QuotaReading:
    """The project-wide GPUS_ALL_REGIONS quota and usage."""
    from google.cloud import compute_v1

    project = projects_client.get(request=compute_v1.GetProjectRequest(project=config.project))
    quota = next((q for q in project.quotas if q.metric == GLOBAL_GPU_METRIC), None)
    return QuotaReading("global", GLOBAL_GPU_METRIC, quota.limit if quota else None, quota.usage if quota else None,
                        gpus_needed(config), "" if quota else (
                            f"Compute Engine reported no {GLOBAL_GPU_METRIC} for {config.project}: read it with "
                            "`gcloud compute project-info describe` or in IAM & Admin > Quotas"))


def gpu_quota(config: GpuflowConfig, regions_client, projects_client, regions: list[str] | None = None
              ) -> list[QuotaReading]:
    """Every quota a launch must fit: the GPU's in each region, then the project-wide one."""
    return [*regional_gpu_quota(config, regions_client, regions), global_gpu_quota(config, projects_client)]


def format_quota(readings: list[QuotaReading]) -> str:
    def number(value: float | None) -> str:
        return "?" if value is None else f"{value:g}"

    lines = [f"{'REGION':<24} {'METRIC':<28} {'LIMIT':>6} {'USAGE':>6} {'FREE':>6} {'NEEDED':>6}  STATUS"]
    for r in readings:
        status = "UNKNOWN: " + r.fix if not r.known else "ok" if r.enough else "NOT ENOUGH"
        lines.append(f"{r.region:<24} {r.metric:<28} {number(r.limit):>6} {number(r.usage):>6} "
                     f"{number(r.headroom):>6} {r.needed:>6}  {status}")
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
