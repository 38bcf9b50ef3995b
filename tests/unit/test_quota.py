"""Regional GPU quota, read through a Compute Engine client faked at its boundary with the real compute_v1 types."""

import pytest

from gpuflow.config import load_config
from gpuflow.quota import format_quota, local_gpu_report, quota_regions, regional_gpu_quota
from tests.gcp_fakes import FakeRegionsClient


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


def test_a_region_without_the_metric_has_no_quota():
    readings = regional_gpu_quota(config(), FakeRegionsClient({"us-central1": [("CPUS", 24, 0)]}))
    assert (readings[0].limit, readings[0].enough) == (0.0, False)


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
