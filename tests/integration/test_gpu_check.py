"""beam_jobs/gpu_check.py on the DirectRunner. This machine has no GPU, which is what these tests rely on."""

import json

import pytest

import gpu_check


def test_without_require_gpu_it_reports_no_gpu(tmp_path):
    report_path = tmp_path / "report.json"
    gpu_check.run(["--report", str(report_path), "--runner=BundleBasedDirectRunner"])
    report = json.loads(report_path.read_text())
    assert report["gpu_found"] is False
    assert gpu_check.TORCH_NO_GPU in report["errors"]
    assert report["torch"]["cuda_available"] is False


def test_with_require_gpu_it_fails_with_the_guides_message(tmp_path):
    with pytest.raises(Exception, match="PyTorch failed to detect GPUs with your setup"):
        gpu_check.run(["--report", str(tmp_path / "r.json"), "--require-gpu", "--runner=BundleBasedDirectRunner"])
