"""On a machine with a GPU (and torch, transformers, tokenizers, safetensors; no Beam, no network needed): do
bf16 batched answers equal ``generate`` alone, and how fast is decoding next to the memory-bandwidth bound?

    benchmarks/gpu_check.sh            # what a lent GPU machine runs (a few minutes)
    python benchmarks/gpu_check.py --device cpu --quick   # the same steps, small, on a CPU (a smoke run)

1. Equality: the offline demo models (a T5 and a Llama-shaped one), each in bf16 on the device: 64 mixed-length
   prompts, batched as the pipeline batches them (beam_jobs/llm_models.py, padding with an attention mask), against
   ``generate`` on each prompt alone. bf16 sums in another order when the batch pads, so a rare token may differ:
   the count of differing answers is printed, not hidden.
2. Decode speed: random models of flan-t5-base's shape and of a 1B-parameter causal shape, bf16, at batch sizes 1,
   8 and 32: generated tokens per second, next to the bound the GPU's memory bandwidth sets (each decode step reads
   every weight once: bandwidth / weight bytes steps per second, times the batch). The bandwidth is measured here
   (a large device-to-device copy), not taken from a data sheet.
3. The Beam GPU-check pipeline (beam_jobs/gpu_check.py), where Beam is installed; otherwise it says SKIPPED.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "beam_jobs"), str(ROOT / "plugins")]

T5_BASE_SHAPE = dict(d_model=768, d_ff=2048, num_layers=12, num_decoder_layers=12, num_heads=12, d_kv=64)
#: About 1.1B parameters with the demo tokenizer's small vocabulary (TinyLlama-like depth and width).
CAUSAL_1B_SHAPE = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                       num_key_value_heads=4, max_position_embeddings=2048)
QUICK_SHAPES = {"seq2seq": dict(d_model=128, d_ff=256, num_layers=2, num_decoder_layers=2, num_heads=4, d_kv=32),
                "causal": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2)}


def loaded(architecture: str, device: str, dtype, workdir: Path, **shape):
    """A demo model written offline, loaded as the pipeline loads it (llm_models.load_model), in ``dtype``."""
    import torch

    from gpuflow.platform.demo_model import write_demo_model
    from llm_models import LoadedModel, load_model, load_tokenizer

    directory = write_demo_model(Path(tempfile.mkdtemp(prefix=f"{architecture}-", dir=workdir)),
                                 architecture=architecture, **shape)
    auto = "AutoModelForSeq2SeqLM" if architecture == "seq2seq" else "AutoModelForCausalLM"
    import transformers

    model = getattr(transformers, auto).from_pretrained(directory, dtype=torch.bfloat16)
    torch.save(model.state_dict(), directory / "state_dict.pth")
    del model
    model = load_model(str(directory), str(directory / "state_dict.pth"), device, dtype, architecture)
    return LoadedModel(model, load_tokenizer(str(directory)), device, architecture)


def alone(loaded_model, tokens: list[int], max_new_tokens: int) -> str:
    return loaded_model.generate([tokens], max_new_tokens)[0]


def check_equality(device: str, workdir: Path, quick: bool) -> dict:
    import torch

    from gpuflow.platform.demo_model import _WORDS

    results = {}
    for architecture in ("seq2seq", "causal"):
        model = loaded(architecture, device, torch.bfloat16, workdir)
        prompts = [" ".join(_WORDS[(i * 7 + j) % len(_WORDS)] for j in range(1 + (i * 13) % 120))
                   for i in range(16 if quick else 64)]
        tokens = [model.tokenizer(p)["input_ids"] for p in prompts]
        batched = []
        for start in range(0, len(tokens), 16):
            batched += model.generate(tokens[start:start + 16], 16)
        differing = sum(b != alone(model, t, 16) for b, t in zip(batched, tokens, strict=True))
        results[architecture] = {"prompts": len(prompts), "differing": differing}
        print(f"  {architecture:8} bf16 on {device}: {len(prompts) - differing}/{len(prompts)} batched answers equal "
              "generate alone", flush=True)
    return results


def measured_bandwidth_gbs(device: str) -> float:
    """Bytes moved per second by a large copy (read + write), the best of a few."""
    import torch

    size = 256 * 2**20 if device == "cuda" else 64 * 2**20
    source = torch.empty(size, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    best = 0.0
    for _ in range(5):
        if device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        target.copy_(source)
        if device == "cuda":
            torch.cuda.synchronize()
        best = max(best, 2 * size / (time.perf_counter() - started) / 1e9)
    return best


def decode_speed(device: str, workdir: Path, quick: bool, bandwidth_gbs: float) -> list[dict]:
    import torch

    rows = []
    shapes = QUICK_SHAPES if quick else {"seq2seq": T5_BASE_SHAPE, "causal": CAUSAL_1B_SHAPE}
    for architecture, shape in shapes.items():
        model = loaded(architecture, device, torch.bfloat16, workdir, **shape)
        weight_bytes = sum(p.numel() * p.element_size() for p in model.model.parameters())
        prompt = model.tokenizer("tell me about the river and the mountain")["input_ids"]
        new_tokens = 8 if quick else 64
        for batch in (1, 8, 32):
            model.generate([prompt] * batch, 2)  # warm up
            if device == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
            model.generate([prompt] * batch, new_tokens)
            if device == "cuda":
                torch.cuda.synchronize()
            tokens_per_s = batch * new_tokens / (time.perf_counter() - started)
            bound = batch * bandwidth_gbs * 1e9 / weight_bytes
            rows.append({"model": architecture, "parameters_m": round(weight_bytes / 2 / 1e6), "batch": batch,
                         "tokens_per_s": round(tokens_per_s, 1), "bandwidth_bound_tokens_per_s": round(bound, 1),
                         "share_of_bound": round(tokens_per_s / bound, 3)})
            print(f"  {architecture:8} {weight_bytes / 2 / 1e6:7.0f}M params  batch {batch:2}: "
                  f"{tokens_per_s:9.1f} tokens/s; bandwidth bound {bound:10.1f} ({tokens_per_s / bound:.0%})",
                  flush=True)
    return rows


def beam_gpu_check(workdir: Path) -> str:
    try:
        import apache_beam  # noqa: F401
    except ImportError:
        return "SKIPPED: apache_beam is not installed on this machine"
    report = workdir / "gpu-check.json"
    done = subprocess.run([sys.executable, str(ROOT / "beam_jobs" / "gpu_check.py"), "--report", str(report),
                           "--runner=DirectRunner", "--direct_running_mode=in_memory"],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        return f"FAILED: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}"
    return f"gpu_found={json.loads(report.read_text())['gpu_found']}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--quick", action="store_true", help="small shapes and fewer prompts (a smoke run)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    import logging

    import torch

    logging.disable(logging.WARNING)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device visible to torch: run with --device cpu for a smoke run")
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    print(f"device: {name}; torch {torch.__version__}", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="gpuflow-gpu-check-"))
    print("1. bf16 batched answers against generate alone", flush=True)
    equality = check_equality(args.device, workdir, args.quick)
    bandwidth = measured_bandwidth_gbs(args.device)
    print(f"2. decode speed (measured copy bandwidth {bandwidth:.0f} GB/s)", flush=True)
    speed = decode_speed(args.device, workdir, args.quick, bandwidth)
    print("3. Beam GPU-check pipeline:", beam_gpu_check(workdir), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": name, "equality": equality, "bandwidth_gbs": bandwidth,
                                               "decode": speed}, indent=2))


if __name__ == "__main__":
    main()
