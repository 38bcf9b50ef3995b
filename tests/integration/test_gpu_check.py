"""beam_jobs/gpu_check.py on the DirectRunner. The no-GPU path runs with the GPUs hidden from CUDA
(CUDA_VISIBLE_DEVICES empty, in a process of its own, before CUDA starts), so it holds on a machine that has one; the
found-GPU path runs where this machine has a GPU, and says it was skipped where it has none."""

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.timeout(300)


def gpu_check_run(tmp_path, *args: str, hide_gpus: bool) -> subprocess.CompletedProcess:
    """gpu_check.run in a process of its own, where CUDA sees no GPU when ``hide_gpus``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "beam_jobs"), os.environ.get("PYTHONPATH", "")])}
    if hide_gpus:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return subprocess.run([sys.executable, "-c", "import sys, gpu_check; gpu_check.run(sys.argv[1:])",
                           "--report", str(tmp_path / "report.json"), "--runner=BundleBasedDirectRunner", *args],
                          env=env, capture_output=True, text=True, timeout=240)


def test_without_require_gpu_it_reports_no_gpu(tmp_path):
    import gpu_check

    done = gpu_check_run(tmp_path, hide_gpus=True)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["gpu_found"] is False
    assert gpu_check.TORCH_NO_GPU in report["errors"]
    assert report["torch"]["cuda_available"] is False


def test_with_require_gpu_it_fails_with_the_guides_message(tmp_path):
    done = gpu_check_run(tmp_path, "--require-gpu", hide_gpus=True)
    assert done.returncode != 0
    assert "PyTorch failed to detect GPUs with your setup" in done.stderr


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(not _has_gpu(), reason="this machine has no GPU that torch can use: the found path is checked "
                                            "where one is (a workstation, or the device check's machine)")
def test_with_a_gpu_it_reports_the_gpu_it_found(tmp_path):
    done = gpu_check_run(tmp_path, "--require-gpu", hide_gpus=False)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["gpu_found"] is True and report["torch"]["devices"] and report["errors"] == []
