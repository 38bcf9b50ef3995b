"""Regional GPU quota, read through a Compute Engine client faked at its boundary with the real compute_v1 types."""

import pytest

from gpuflow.config import load_config
from gpuflow.quota import format_quota, global_gpu_quota, gpu_quota, local_gpu_report, quota_regions, regional_gpu_quota
from tests.gcp_fakes import FakeProjectsClient, FakeRegionsClient


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


def test_h100_has_no_regional_compute_metric_and_is_reported_unknown_with_the_gpu_family_quota():
    cfg = config("gpu.type=nvidia-h100-80gb", "gpu.machine_type=a3-highgpu-8g", "gpu.count=8")
    client = FakeRegionsClient({"us-central1": [("PREEMPTIBLE_NVIDIA_H100_GPUS", 8, 0)]})
    (reading,) = regional_gpu_quota(cfg, client)
    assert not reading.known and "GPUS-PER-GPU-FAMILY-per-project-region" in reading.fix
    assert client.requests == []  # nothing to read in Compute Engine's regional quotas


def test_the_project_wide_gpu_quota_bounds_every_launch():
    cfg = config("worker.max_num_workers=4")
    regional, project_wide = gpu_quota(cfg, FakeRegionsClient({"us-central1": [("NVIDIA_L4_GPUS", 16, 0)]}),
                                       FakeProjectsClient((("GPUS_ALL_REGIONS", 4, 2),)))
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
