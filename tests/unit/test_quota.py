"""Regional GPU quota, read through a Compute Engine client faked at its boundary with the real compute_v1 types."""

import pytest

from gpuflow.configuration.loading import load_config
from gpuflow.gpus.quota import (
    ComputeClients,
    format_quota,
    global_gpu_quota,
    gpu_quota,
    quota_regions,
    regional_gpu_quota,
)
from gpuflow.steps.quota import local_gpu_report
from tests.gcp_fakes import FakeCloudQuotas, FakeProjectsClient, FakeRegionsClient


def config(*overrides):
    return load_config("configs/gcp.example.yaml", overrides=list(overrides))


def test_headroom_per_region_against_count_times_max_workers():
    client = FakeRegionsClient({
        "us-central1": [("CPUS", 24, 0), ("NVIDIA_L4_GPUS", 8, 7), ("NVIDIA_T4_GPUS", 4, 0)],
        "us-east4": [("NVIDIA_L4_GPUS", 16, 0)],
    })
    cfg = config("worker.max_num_workers=2", "gpu.fallbacks=[{region: us-east4}]")
    readings = regional_gpu_quota(cfg, client)
    assert [(r.region, r.metric, r.headroom, r.needed, r.enough) for r in readings] == [
        ("us-central1", "NVIDIA_L4_GPUS", 1.0, 2, False),
        ("us-east4", "NVIDIA_L4_GPUS", 16.0, 2, True),
    ]
    assert [(r.project, r.region) for r in client.requests] == [("my-gcp-project", "us-central1"),
                                                               ("my-gcp-project", "us-east4")]
    table = format_quota(readings)
    assert "NOT ENOUGH" in table and "us-east4" in table


def test_a_metric_the_api_does_not_report_is_unknown_with_its_fix_never_a_limit_of_zero():
    readings = regional_gpu_quota(config(), FakeRegionsClient({"us-central1": [("CPUS", 24, 0)]}))
    assert (readings[0].known, readings[0].limit, readings[0].enough) == (False, None, None)
    assert "IAM & Admin > Quotas" in readings[0].fix and "UNKNOWN" in format_quota(readings)


H100 = ("gpu.type=nvidia-h100-80gb", "gpu.machine_type=a3-highgpu-8g", "gpu.count=8")


def test_h100_quota_is_the_gpu_family_limit_from_cloud_quotas_not_a_regional_compute_metric():
    cfg = config(*H100, "gpu.fallbacks=[{region: us-east4}]")
    regions = FakeRegionsClient({"us-central1": [("PREEMPTIBLE_NVIDIA_H100_GPUS", 8, 0)]})
    quotas = FakeCloudQuotas({("us-central1", "NVIDIA_H100"): 16, ("us-central1", "NVIDIA_A100"): 64}, default=0)
    central, east = regional_gpu_quota(cfg, regions, quotas_client=quotas)
    assert regions.requests == []  # nothing to read in Compute Engine's regional quotas
    (request,) = quotas.requests
    assert request.name == ("projects/my-gcp-project/locations/global/services/compute.googleapis.com/quotaInfos/"
                            "GPUS-PER-GPU-FAMILY-per-project-region")
    # us-central1: 16 H100s, enough for 8 if none is in use (Cloud Quotas reports no usage): not known to be short.
    assert (central.metric, central.limit, central.usage, central.enough) == (
        "GPUS-PER-GPU-FAMILY-per-project-region (NVIDIA_H100/NVIDIA_H100_80GB)", 16, None, None)
    # us-east4: only the default for every family (0) applies, a less specific limit that is never taken: unknown.
    assert (east.known, east.limit, east.enough) == (False, None, None)
    assert "UNKNOWN" in format_quota([east]) and "gcloud beta quotas info describe" in east.fix
    assert "limit ok (usage is not reported" in format_quota([central])


def test_h100_quota_matches_the_family_as_the_quota_info_spells_it():
    """Google's quota page writes NVIDIA_H100, its Cluster Toolkit A3 page NVIDIA_H100_80GB: either is the H100's."""
    for spelling in ("NVIDIA_H100", "NVIDIA_H100_80GB"):
        quotas = FakeCloudQuotas({("us-central1", spelling): 24, ("us-central1", "NVIDIA_A100_80GB"): 64}, default=2)
        (reading,) = regional_gpu_quota(config(*H100), FakeRegionsClient({}), quotas_client=quotas)
        assert (reading.known, reading.limit) == (True, 24), spelling


def test_a_quota_info_of_another_family_only_is_unknown_never_its_limit():
    quotas = FakeCloudQuotas({("us-central1", "NVIDIA_H200"): 64, ("us-central1", "NVIDIA_A100_80GB"): 64}, default=8)
    (reading,) = regional_gpu_quota(config(*H100), FakeRegionsClient({}), quotas_client=quotas)
    assert (reading.known, reading.limit, reading.enough) == (False, None, None)


def test_h100_without_a_cloud_quotas_answer_is_unknown_with_the_fix():
    from google.api_core.exceptions import PermissionDenied

    class Refusing(FakeCloudQuotas):
        def get_quota_info(self, request):
            raise PermissionDenied("Permission 'cloudquotas.quotas.get' denied on resource")

    for quotas in (None, Refusing()):
        (reading,) = regional_gpu_quota(config(*H100), FakeRegionsClient({}), quotas_client=quotas)
        assert not reading.known and reading.enough is None
        assert "gcloud beta quotas info describe GPUS-PER-GPU-FAMILY-per-project-region" in reading.fix


def test_a_gpu_whose_quota_no_read_page_names_is_unknown_without_asking():
    """A3 Mega's H100: gpuflow has no source for its quota, so it asks nothing and says where to read it."""
    regions, quotas = FakeRegionsClient({}), FakeCloudQuotas()
    (reading,) = regional_gpu_quota(config("gpu.type=nvidia-h100-mega-80gb", "gpu.machine_type=a3-megagpu-8g",
                                           "gpu.count=8"), regions, quotas_client=quotas)
    assert (regions.requests, quotas.requests) == ([], [])
    assert (reading.known, reading.enough) == (False, None) and "IAM & Admin > Quotas" in reading.fix


def test_the_project_wide_gpu_quota_bounds_every_launch():
    cfg = config("worker.max_num_workers=4")
    regional, project_wide = gpu_quota(cfg, ComputeClients(
        FakeRegionsClient({"us-central1": [("NVIDIA_L4_GPUS", 16, 0)]}), FakeProjectsClient((("GPUS_ALL_REGIONS", 4, 2),)),
        None, FakeCloudQuotas()))
    assert regional.enough and (project_wide.region, project_wide.headroom, project_wide.enough) == ("global", 2.0, False)
    unknown = global_gpu_quota(cfg, FakeProjectsClient(()))
    assert not unknown.known and "project-info describe" in unknown.fix


def test_t4_uses_its_own_metric():
    cfg = config("gpu.type=nvidia-tesla-t4", "gpu.machine_type=n1-standard-8", "model.dtype=float32")
    readings = regional_gpu_quota(cfg, FakeRegionsClient({"us-central1": [("NVIDIA_T4_GPUS", 4, 0)]}))
    assert readings[0].metric == "NVIDIA_T4_GPUS" and readings[0].enough


def test_quota_regions_are_unique_and_ordered():
    cfg = config("gpu.fallbacks=[{region: us-east4}, {type: nvidia-tesla-t4}, {region: us-central1}]")
    assert quota_regions(cfg) == ["us-central1", "us-east4"]


def test_unknown_gpu_type_is_refused():
    with pytest.raises(ValueError, match="gpuflow preflight"):
        regional_gpu_quota(config("gpu.type=nvidia-x"), FakeRegionsClient({}))


@pytest.mark.skipif(__import__("shutil").which("nvidia-smi") is not None, reason="this machine has a GPU")
def test_local_report_says_plainly_there_is_no_gpu():
    report = local_gpu_report(load_config(None))
    assert report["count"] == 0 and report["torch_cuda_devices"] == 0 and report["enough"] is False
    assert "no GPU" in report["note"]
