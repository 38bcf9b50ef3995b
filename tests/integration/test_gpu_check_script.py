"""benchmarks/gpu_check.sh, the script a lent GPU machine runs, in its smoke form on this CPU: every step runs and
the figures it writes are whole (on a GPU: the same steps, full size)."""

import json
import os
import subprocess
import sys

from tests.helpers import ROOT


def test_the_gpu_check_script_runs_its_three_steps(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "DEVICE": "cpu", "QUICK": "1", "OUT": str(tmp_path)}
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads((tmp_path / "gpu_check.json").read_text())
    assert {name: result["differing"] for name, result in figures["equality"].items()} == {"seq2seq": 0, "causal": 0}
    assert [(row["model"], row["batch"]) for row in figures["decode"]] == [
        ("seq2seq", 1), ("seq2seq", 8), ("seq2seq", 32), ("causal", 1), ("causal", 8), ("causal", 32)]
    assert all(row["tokens_per_s"] > 0 and row["bandwidth_bound_tokens_per_s"] > 0 for row in figures["decode"])
    assert "3. Beam GPU-check pipeline: gpu_found=False" in done.stdout  # Beam is here; no GPU
