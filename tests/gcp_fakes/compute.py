"""Compute Engine (regions, projects, accelerator types) and Cloud Quotas: the quotas and offers preflight reads."""

from __future__ import annotations

from google.cloud import compute_v1, dataflow_v1beta3

JobState = dataflow_v1beta3.JobState
Importance = dataflow_v1beta3.JobMessageImportance


class FakeRegionsClient:
    """Answers RegionsClient.get like the Compute API does; records each request."""

    def __init__(self, quotas_by_region):
        self.quotas_by_region = quotas_by_region
        self.requests = []

    def get(self, request):
        assert isinstance(request, compute_v1.GetRegionRequest)
        self.requests.append(request)
        quotas = [compute_v1.Quota(metric=m, limit=lim, usage=use) for m, lim, use in self.quotas_by_region[request.region]]
        return compute_v1.Region(name=request.region, quotas=quotas)


class FakeProjectsClient:
    """Answers ProjectsClient.get with the project's quotas, GPUS_ALL_REGIONS among them; records each request."""

    def __init__(self, quotas=(("GPUS_ALL_REGIONS", 16, 0), ("CPUS_ALL_REGIONS", 96, 0))):
        self.quotas = quotas
        self.requests = []

    def get(self, request):
        assert isinstance(request, compute_v1.GetProjectRequest)
        self.requests.append(request)
        return compute_v1.Project(name=request.project, quotas=[
            compute_v1.Quota(metric=metric, limit=limit, usage=usage) for metric, limit, usage in self.quotas])


class FakeCloudQuotas:
    """Cloud Quotas' GetQuotaInfo for GPUS-PER-GPU-FAMILY-per-project-region: ``limits`` maps (region, gpu_family)
    to a limit, answered as dimensions infos from the most specific to the least (a default for every region and
    family last); records each request."""

    def __init__(self, limits=None, default: int = 0):
        self.limits = limits or {}
        self.default = default
        self.requests = []

    def get_quota_info(self, request):
        from google.cloud import cloudquotas_v1

        assert isinstance(request, cloudquotas_v1.GetQuotaInfoRequest)
        self.requests.append(request)
        infos = [cloudquotas_v1.DimensionsInfo(dimensions={"region": region, "gpu_family": family},
                                               details=cloudquotas_v1.QuotaDetails(value=limit),
                                               applicable_locations=[region])
                 for (region, family), limit in self.limits.items()]
        infos.append(cloudquotas_v1.DimensionsInfo(details=cloudquotas_v1.QuotaDetails(value=self.default),
                                                   applicable_locations=["us-central1", "us-east4", "europe-west4"]))
        return cloudquotas_v1.QuotaInfo(name=request.name, quota_id=request.name.rsplit("/", 1)[-1],
                                        service="compute.googleapis.com", dimensions=["region", "gpu_family"],
                                        dimensions_infos=infos)


class FakeAcceleratorTypesClient:
    """Answers AcceleratorTypesClient.aggregated_list like Compute Engine: the real pager over one page of zone
    scopes, filtered by the request's name filter; records each request."""

    def __init__(self, offers=None):
        self.offers = offers or {"us-central1-a": ["nvidia-l4", "nvidia-tesla-t4"], "us-central1-b": ["nvidia-l4"],
                                 "us-east4-c": ["nvidia-l4"], "europe-west4-a": ["nvidia-tesla-t4"]}
        self.requests = []

    def aggregated_list(self, request):
        from google.cloud.compute_v1.services.accelerator_types import pagers

        assert isinstance(request, compute_v1.AggregatedListAcceleratorTypesRequest)
        self.requests.append(request)
        wanted = request.filter.split('"')[1] if '"' in request.filter else None
        items = {f"zones/{zone}": compute_v1.AcceleratorTypesScopedList(accelerator_types=[
            compute_v1.AcceleratorType(name=name, zone=zone) for name in names if wanted in (None, name)])
            for zone, names in self.offers.items()}
        return pagers.AggregatedListPager(method=self._no_next_page, request=request,
                                          response=compute_v1.AcceleratorTypeAggregatedList(items=items))

    @staticmethod
    def _no_next_page(request, **kwargs):
        raise AssertionError("one page only: the response has no next_page_token")
