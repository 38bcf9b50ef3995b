"""The llm_batch_inference DAG's batch job against a plain loop of batched ``generate``, on the same prompts, side
by side in one run (model load and pipeline start included in both).

    .venv/bin/python benchmarks/batch_dag.py [--prompts 256] [--shape small]

(a) the exact job run_batch starts on the local profile: ``pipeline_argv(config, names, batch=True)`` from
    configs/local.yaml (its batching: up to 16 prompts, grouped by length), run by ``LocalPlatform.pipeline_command``
    in a subprocess, as the DAG does; only the model paths point at this benchmark's model;
(b) a plain loop of batched ``generate`` calls (16 prompts a batch, arrival order) in this process.

Target: a/b >= 0.8 (prompts/s). Random weights of t5-small's shape. Run by hand, not in `make test`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from inference_throughput import SHAPES, prepare, run_plain_loop  # noqa: E402 - the same model and prompts


def dag_batch_command(model_dir: Path, workdir: Path) -> tuple[list[str], Path, Any]:
    """The command run_batch runs for a date whose input is ``workdir/prompts/2026-03-01/*.jsonl``."""
    from gpuflow.configuration.loading import load_config
    from gpuflow.platform.local import LocalPlatform
    from gpuflow.runs.batch_paths import staging_folders
    from gpuflow.runs.batch_templates import fill_batch_paths
    from gpuflow.runs.naming import resource_names
    from gpuflow.steps.launch import pipeline_argv

    config = fill_batch_paths(load_config(None, overrides=[
        f"batch.input={workdir}/prompts/{{ds}}/*.jsonl", f"batch.output={workdir}/answers/{{ds}}/",
        f"batch.dead_letter_output={workdir}/dead_letters/{{ds}}/", f"local.state_dir={workdir}/state"]),
        {"ds": "2026-03-01"})
    names = resource_names(config, "gf-benchmark")
    argv = pipeline_argv(config, names, batch=True)
    argv[argv.index("--model-name") + 1] = str(model_dir)
    argv[argv.index("--state-dict-path") + 1] = str(model_dir / "state_dict.pth")
    answers, _ = staging_folders(config, names.prefix)
    return LocalPlatform(config).pipeline_command(argv, streaming=False), Path(answers), config


def run_dag_job(model_dir: Path, prompts: list[dict], workdir: Path) -> tuple[float, int]:
    command, answers, config = dag_batch_command(model_dir, workdir)
    input_folder = workdir / "prompts" / "2026-03-01"
    input_folder.mkdir(parents=True)
    (input_folder / "part-0.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    elapsed = time.perf_counter() - started
    summary = json.loads((answers / "summary.json").read_text())
    assert summary["answered"] == len(prompts), summary
    return elapsed, config.model.max_new_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="gpuflow-bench-batch-"))
    model_dir, prompts = prepare(workdir, args.shape, args.prompts)
    dag_seconds, new_tokens = run_dag_job(model_dir, prompts, workdir)
    loop_seconds = run_plain_loop(model_dir, prompts, new_tokens)
    a, b = args.prompts / dag_seconds, args.prompts / loop_seconds
    print(f"\n{args.prompts} prompts, {new_tokens} new tokens (configs/local.yaml), t5-{args.shape} shape")
    print(f"  a  the DAG's batch job (subprocess)   {dag_seconds:7.1f} s  {a:7.2f} prompts/s")
    print(f"  b  plain batched generate loop       {loop_seconds:7.1f} s  {b:7.2f} prompts/s")
    print(f"  a/b = {a / b:.2f}  (target >= 0.8)")


if __name__ == "__main__":
    main()
