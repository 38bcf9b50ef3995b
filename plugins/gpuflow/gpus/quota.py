"""GPU capacity: Compute Engine regional quota and usage (gcp), or the GPUs of this machine (local)."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from gpuflow import catalog
from gpuflow.configuration.model import GpuflowConfig

if TYPE_CHECKING:
    from google.cloud import cloudquotas_v1, compute_v1

log = logging.getLogger(__name__)


#: The project-wide quota that bounds every GPU in every region, on top of each region's GPU metric. Compute
#: Engine reports it among the project's quotas (`gcloud compute project-info describe`, quotas[].metric;
#: cloud.google.com/compute/resource-usage, "GPU quota").
GLOBAL_GPU_METRIC = "GPUS_ALL_REGIONS"
#: GPU types without a regional Compute Engine metric (H100) have their on-demand quota in Cloud Quotas, per GPU
#: family and region (catalog/gpus.yaml: quota_families). Cloud Quotas reports the limit, not the usage.
FAMILY_QUOTA_ID = "GPUS-PER-GPU-FAMILY-per-project-region"


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
        """True or False when known; None when the limit is unknown, or when only the limit is (Cloud Quotas reports
        no usage) and it would be enough if nothing were in use."""
        if self.limit is None:
            return None
        if self.usage is None:
            return False if self.limit < self.needed else None
        return self.limit - self.usage >= self.needed

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "headroom": self.headroom, "enough": self.enough, "known": self.known}


def quota_regions(config: GpuflowConfig) -> list[str]:
    """The configured region, then every fallback region, each once."""
    regions = [config.region, *(f.region for f in config.gpu.fallbacks if f.region)]
    return list(dict.fromkeys(regions))


def gpus_needed(config: GpuflowConfig) -> int:
    return config.gpu.count * config.worker.max_num_workers


class ComputeClients(NamedTuple):
    regions: compute_v1.RegionsClient
    projects: compute_v1.ProjectsClient
    accelerator_types: compute_v1.AcceleratorTypesClient
    cloud_quotas: cloudquotas_v1.CloudQuotasClient


def compute_clients(gcp_conn_id: str, impersonation_chain: list[str] | None = None) -> ComputeClients:
    """Compute Engine's Regions, Projects and AcceleratorTypes clients and the Cloud Quotas client, with the Airflow
    connection's credentials.

    Gap in the Airflow Google provider: its ComputeEngineHook reads neither quotas nor accelerator types, and it has
    no Cloud Quotas hook."""
    from airflow.providers.google.common.hooks.base_google import GoogleBaseHook
    from google.cloud import cloudquotas_v1, compute_v1

    credentials = GoogleBaseHook(gcp_conn_id=gcp_conn_id, impersonation_chain=impersonation_chain).get_credentials()
    return ComputeClients(compute_v1.RegionsClient(credentials=credentials),
                          compute_v1.ProjectsClient(credentials=credentials),
                          compute_v1.AcceleratorTypesClient(credentials=credentials),
                          cloudquotas_v1.CloudQuotasClient(credentials=credentials))


def zones_offering(project: str, gpu_type: str, region: str, client: compute_v1.AcceleratorTypesClient) -> list[str]:
    """The zones of the region that offer the GPU type, as Compute Engine lists its accelerator types now
    (acceleratorTypes.aggregatedList, filtered by name)."""
    from google.cloud import compute_v1

    pager = client.aggregated_list(request=compute_v1.AggregatedListAcceleratorTypesRequest(
        project=project, filter=f'name = "{gpu_type}"'))
    return sorted(scope.removeprefix("zones/") for scope, listed in pager
                  if scope.startswith(f"zones/{region}-") and any(a.name == gpu_type for a in listed.accelerator_types))


def _unknown_fix(gpu: catalog.GpuType, region: str) -> str:
    if gpu.quota_metric is None and not gpu.quota_families:
        return (f"gpuflow's catalog names no quota for {gpu.name} (catalog/gpus.yaml): read its limit in {region} "
                "in IAM & Admin > Quotas, filtered by the GPU's name")
    if gpu.quota_families:
        return (f"Cloud Quotas reported no {FAMILY_QUOTA_ID} limit for gpu_family {' or '.join(gpu.quota_families)} "
                f"in {region}: read it with `gcloud beta quotas info describe {FAMILY_QUOTA_ID} "
                "--service=compute.googleapis.com` or in IAM & Admin > Quotas")
    return (f"Compute Engine reported no {gpu.quota_metric} quota for {region}: check the region offers "
            f"{gpu.name} and read the quota in IAM & Admin > Quotas")


def family_gpu_limits(project: str, families: tuple[str, ...], regions: list[str],
                      client: cloudquotas_v1.CloudQuotasClient) -> dict[str, float]:
    """The GPU family's on-demand limit per region, from Cloud Quotas' QuotaInfo of GPUS-PER-GPU-FAMILY-per-project-
    region.

    Only a dimensions info that names the family itself (its ``gpu_family`` value is one of ``families``, the
    spellings Google's pages use) and the region (its ``region`` dimension, or else its applicable locations) holds
    the limit. A less specific one (no ``gpu_family``: the default for every family) is never taken: a region with
    no exact match is left out, and so reads as unknown."""
    from google.api_core.exceptions import GoogleAPICallError
    from google.cloud import cloudquotas_v1

    try:
        info = client.get_quota_info(request=cloudquotas_v1.GetQuotaInfoRequest(
            name=cloudquotas_v1.CloudQuotasClient.quota_info_path(project, "global", "compute.googleapis.com",
                                                                   FAMILY_QUOTA_ID)))
    except GoogleAPICallError as error:  # no permission, API not enabled: the quota is unknown, with the fix
        log.warning("Cloud Quotas did not answer for %s (%s)", FAMILY_QUOTA_ID, error)
        return {}
    limits: dict[str, float] = {}
    for region in regions:
        for dimensions_info in info.dimensions_infos:
            dimensions = dict(dimensions_info.dimensions)
            if dimensions.get("gpu_family") not in families:
                continue
            in_region = dimensions["region"] == region if "region" in dimensions else \
                region in dimensions_info.applicable_locations
            if in_region:
                limits[region] = float(dimensions_info.details.value)
                break
        else:
            seen = sorted({dict(d.dimensions).get("gpu_family", "(none)") for d in info.dimensions_infos})
            log.warning("Cloud Quotas lists no %s limit for gpu_family %s in %s (families it lists: %s)",
                        FAMILY_QUOTA_ID, " or ".join(families), region, ", ".join(seen))
    return limits


def regional_gpu_quota(config: GpuflowConfig, client: compute_v1.RegionsClient, regions: list[str] | None = None,
                       quotas_client: cloudquotas_v1.CloudQuotasClient | None = None) -> list[QuotaReading]:
    """The GPU's regional quota and usage (Compute Engine), or, for a GPU family quota, its limit (Cloud Quotas);
    a quota the API does not report is unknown, never a limit of 0."""
    from google.cloud import compute_v1

    gpu = catalog.gpu_type(config.gpu.type)
    if gpu is None:
        raise ValueError(f"gpu.type {config.gpu.type!r} is unknown. Fix: run `gpuflow preflight` first.")
    regions = regions or quota_regions(config)
    if gpu.quota_metric is None and not gpu.quota_families:
        return [QuotaReading(region, f"{gpu.name} GPUs", None, None, gpus_needed(config), _unknown_fix(gpu, region))
                for region in regions]
    if gpu.quota_families:
        limits = family_gpu_limits(config.project, gpu.quota_families, regions, quotas_client) if quotas_client else {}
        family = "/".join(gpu.quota_families)
        return [QuotaReading(region, f"{FAMILY_QUOTA_ID} ({family})", limits.get(region), None,
                             gpus_needed(config), "usage is not reported by Cloud Quotas" if region in limits
                             else _unknown_fix(gpu, region)) for region in regions]
    readings = []
    for region in regions:
        answer = client.get(request=compute_v1.GetRegionRequest(project=config.project, region=region))
        quota = next((q for q in answer.quotas if q.metric == gpu.quota_metric), None)
        readings.append(QuotaReading(region, str(gpu.quota_metric), quota.limit if quota else None,
                                     quota.usage if quota else None, gpus_needed(config),
                                     "" if quota else _unknown_fix(gpu, region)))
    return readings


def global_gpu_quota(config: GpuflowConfig, projects_client: compute_v1.ProjectsClient) -> QuotaReading:
    """The project-wide GPUS_ALL_REGIONS quota and usage."""
    from google.cloud import compute_v1

    project = projects_client.get(request=compute_v1.GetProjectRequest(project=config.project))
    quota = next((q for q in project.quotas if q.metric == GLOBAL_GPU_METRIC), None)
    return QuotaReading("global", GLOBAL_GPU_METRIC, quota.limit if quota else None, quota.usage if quota else None,
                        gpus_needed(config), "" if quota else (
                            f"Compute Engine reported no {GLOBAL_GPU_METRIC} for {config.project}: read it with "
                            "`gcloud compute project-info describe` or in IAM & Admin > Quotas"))


def gpu_quota(config: GpuflowConfig, clients: ComputeClients, regions: list[str] | None = None) -> list[QuotaReading]:
    """Every quota a launch must fit: the GPU's in each region, then the project-wide one (none on CPU workers)."""
    if not config.uses_gpu:
        return []
    return [*regional_gpu_quota(config, clients.regions, regions, clients.cloud_quotas),
            global_gpu_quota(config, clients.projects)]


def format_quota(readings: list[QuotaReading]) -> str:
    def number(value: float | None) -> str:
        return "?" if value is None else f"{value:g}"

    lines = [f"{'REGION':<24} {'METRIC':<28} {'LIMIT':>6} {'USAGE':>6} {'FREE':>6} {'NEEDED':>6}  STATUS"]
    for r in readings:
        status = ("UNKNOWN: " + r.fix if not r.known else "ok" if r.enough else "NOT ENOUGH" if r.enough is False
                  else f"limit ok ({r.fix})")
        lines.append(f"{r.region:<24} {r.metric:<28} {number(r.limit):>6} {number(r.usage):>6} "
                     f"{number(r.headroom):>6} {r.needed:>6}  {status}")
    return "\n".join(lines)
