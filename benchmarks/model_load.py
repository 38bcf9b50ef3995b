"""Model load and export memory, measured side by side in one run.

    .venv/bin/python benchmarks/model_load.py [--shape small|base]

1. The handler's model load (meta-device build in the inference dtype + assign) against a bare
   ``torch.load`` of the same bf16 state_dict. Target: at most 1.5x.
2. The peak RSS of ``download_model.py local`` against the bf16 size of the weights plus the
   interpreter's baseline (Python with torch and transformers imported). Target: at most 1.3x.
Run by hand, not in `make test`.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "beam_jobs"))

SHAPES = {
    "small": dict(d_model=512, d_ff=2048, num_layers=6, num_decoder_layers=6, num_heads=8, d_kv=64),
    "base": dict(d_model=768, d_ff=3072, num_layers=12, num_decoder_layers=12, num_heads=12, d_kv=64),
}

PEAK_RSS_SNIPPET = """
import resource, runpy, sys
sys.argv = {argv!r}
{body}
print("PEAK_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def peak_rss_kb(argv: list[str], body: str) -> int:
    code = PEAK_RSS_SNIPPET.format(argv=argv, body=body)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(result.stdout.strip().splitlines()[-1].split()[1])


def median_seconds(function, repeats: int = 5) -> float:
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        timings.append(time.perf_counter() - started)
    return statistics.median(timings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small")
    args = parser.parse_args()
    import logging

    logging.disable(logging.WARNING)
    import torch

    import llm_models
    from gpuflow.platform.demo_model import write_demo_model

    workdir = Path(tempfile.mkdtemp(prefix="gpuflow-bench-load-"))
    model_dir = write_demo_model(workdir / "model", **SHAPES[args.shape])
    export = workdir / "export" / "state_dict.pth"
    download_model = str(ROOT / "beam_jobs" / "download_model.py")
    export_argv = [download_model, "local", "--model-name", str(model_dir), "--state-dict-path", str(export)]
    export_peak_kb = peak_rss_kb(export_argv, f"runpy.run_path({download_model!r}, run_name='__main__')")
    baseline_kb = peak_rss_kb([], "import torch, transformers\nfrom transformers import AutoModelForSeq2SeqLM")
    state = torch.load(export, weights_only=True)
    bf16_bytes = sum(t.numel() * t.element_size() for t in state.values())
    del state

    bare = median_seconds(lambda: torch.load(export, weights_only=True))
    handler = median_seconds(
        lambda: llm_models.load_model(str(export.parent), str(export), "cpu", torch.bfloat16, "seq2seq")
    )
    handler_fp32 = median_seconds(
        lambda: llm_models.load_model(str(export.parent), str(export), "cpu", torch.float32, "seq2seq")
    )
    bound_kb = bf16_bytes / 1024 + baseline_kb
    print(f"\nt5-{args.shape} shape: {bf16_bytes / 1e6:.0f} MB of bf16 weights "
          f"(this process peaked at {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB)")
    print(f"  bare torch.load                      {bare * 1000:8.1f} ms")
    print(f"  handler load, bf16 (GPU dtype)       {handler * 1000:8.1f} ms   ratio {handler / bare:.2f} (target <= 1.5)")
    print(f"  handler load, fp32 (CPU dtype)       {handler_fp32 * 1000:8.1f} ms   ratio {handler_fp32 / bare:.2f}"
          "  (casts every tensor: more work than a load)")
    print(f"  export peak RSS                      {export_peak_kb / 1024:8.0f} MB")
    print(f"  interpreter baseline + bf16 weights  {bound_kb / 1024:8.0f} MB "
          f"(baseline {baseline_kb / 1024:.0f} MB)")
    print(f"  export peak / (bf16 + baseline)      {export_peak_kb / bound_kb:8.2f}      (target <= 1.3)")


if __name__ == "__main__":
    main()
