"""Prompts per second, whole run (model load and pipeline start included), three contenders side by side.

    .venv/bin/python benchmarks/inference_throughput.py [--prompts 256] [--new-tokens 16] [--shape small]
    .venv/bin/python benchmarks/inference_throughput.py --shape causal-small   # the decoder-only path

(a) our pipeline, batch mode, on the DirectRunner (also with --group-by-length);
(b) a plain loop of batched ``generate`` calls over the prompts in arrival order;
(c) the guide's recipe: PytorchModelHandlerTensor + make_tensor_model_fn("generate"), which needs
    max_batch_size=1 to survive prompts of different lengths.

Targets: a/b >= 0.8 and a/c >= 3. Random weights of t5-small's shape; every answer has exactly
--new-tokens tokens (the demo model never picks end-of-sequence). Run by hand, not in `make test`.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "beam_jobs"))

SHAPES = {
    "tiny": dict(d_model=64, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4, d_kv=16),
    "small": dict(d_model=512, d_ff=2048, num_layers=6, num_decoder_layers=6, num_heads=8, d_kv=64),
    # --shape causal-small: a Llama-shaped decoder of about t5-small's width and depth
    "causal-small": dict(hidden_size=512, intermediate_size=2048, num_hidden_layers=6, num_attention_heads=8,
                         num_key_value_heads=4),
}
BATCH_SIZE = 16


def auto_class(model_dir: Path):
    """AutoModelForSeq2SeqLM or AutoModelForCausalLM, as the model's config says."""
    import transformers

    seq2seq = transformers.AutoConfig.from_pretrained(model_dir).is_encoder_decoder
    return transformers.AutoModelForSeq2SeqLM if seq2seq else transformers.AutoModelForCausalLM


def prepare(workdir: Path, shape: str, count: int) -> tuple[Path, list[dict]]:
    import torch

    from gpuflow.platform.demo_model import _WORDS, write_demo_model

    architecture = "causal" if shape.startswith("causal") else "seq2seq"
    model_dir = write_demo_model(workdir / "model", architecture=architecture, **SHAPES[shape])
    model = auto_class(model_dir).from_pretrained(model_dir, dtype=torch.bfloat16)
    torch.save(model.state_dict(), model_dir / "state_dict.pth")
    rng = random.Random(3)
    prompts = [
        {"id": f"p{i}", "prompt": " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 280)))}
        for i in range(count)
    ]
    return model_dir, prompts


def run_ours(model_dir: Path, prompts: list[dict], new_tokens: int, workdir: Path, group_by_length: bool) -> float:
    import llm_inference

    input_path = workdir / "prompts.jsonl"
    input_path.write_text("\n".join(json.dumps(p) for p in prompts) + "\n")
    out = workdir / ("out-grouped/" if group_by_length else "out/")
    Path(out).mkdir(exist_ok=True)
    argv = ["--model-name", str(model_dir), "--state-dict-path", str(model_dir / "state_dict.pth"),
            "--max-new-tokens", str(new_tokens), "--max-batch-size", str(BATCH_SIZE), "--min-batch-size",
            str(BATCH_SIZE), "--input", str(input_path), "--output", str(out), "--runner", "BundleBasedDirectRunner"]
    if group_by_length:
        argv.append("--group-by-length")
    started = time.perf_counter()
    llm_inference.run(argv, save_main_session=False)
    elapsed = time.perf_counter() - started
    answered = len((out / "responses.jsonl").read_text().splitlines())
    assert answered == len(prompts), f"{answered}/{len(prompts)} answered"
    return elapsed


def run_plain_loop(model_dir: Path, prompts: list[dict], new_tokens: int) -> float:
    import torch
    from transformers import AutoConfig, AutoTokenizer

    started = time.perf_counter()
    model = auto_class(model_dir).from_config(AutoConfig.from_pretrained(model_dir))
    model.load_state_dict(torch.load(model_dir / "state_dict.pth", weights_only=True))
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    for start in range(0, len(prompts), BATCH_SIZE):
        batch = [p["prompt"] for p in prompts[start : start + BATCH_SIZE]]
        encoded = tokenizer(batch, return_tensors="pt", padding=True)
        with torch.inference_mode():
            output = model.generate(**encoded, max_new_tokens=new_tokens, do_sample=False, num_beams=1,
                                    pad_token_id=tokenizer.pad_token_id)
        tokenizer.batch_decode(output, skip_special_tokens=True)  # (a causal tokenizer pads on the left)
    return time.perf_counter() - started


def run_guide_recipe(model_dir: Path, prompts: list[dict], new_tokens: int, workdir: Path) -> float:
    import apache_beam as beam
    from apache_beam.ml.inference.base import RunInference
    from apache_beam.ml.inference.pytorch_inference import PytorchModelHandlerTensor, make_tensor_model_fn
    from apache_beam.options.pipeline_options import PipelineOptions
    from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer

    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    handler = PytorchModelHandlerTensor(
        state_dict_path=str(model_dir / "state_dict.pth"),
        model_class=AutoModelForSeq2SeqLM.from_config,
        model_params={"config": AutoConfig.from_pretrained(model_dir)},
        device="cpu",
        inference_fn=make_tensor_model_fn("generate"),
        min_batch_size=1,
        max_batch_size=1,  # larger batches crash: "stack expects each tensor to be equal size"
    )
    output = workdir / "guide-answers.txt"
    with beam.Pipeline(options=PipelineOptions(["--runner", "BundleBasedDirectRunner"])) as pipeline:
        _ = (
            pipeline
            | beam.Create([p["prompt"] for p in prompts])
            | beam.Map(lambda text: tokenizer(text, return_tensors="pt").input_ids[0])
            | RunInference(handler, inference_args={"max_new_tokens": new_tokens})
            | beam.Map(lambda result: tokenizer.decode(result.inference, skip_special_tokens=True))
            | beam.io.WriteToText(str(output), shard_name_template="")
        )
    elapsed = time.perf_counter() - started
    answered = len(output.read_text().splitlines())
    assert answered == len(prompts), f"{answered}/{len(prompts)} answered"
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small",
                        help="causal-small: a decoder-only model, with contenders a, a' and b")
    args = parser.parse_args()
    import logging

    logging.disable(logging.WARNING)
    workdir = Path(tempfile.mkdtemp(prefix="gpuflow-bench-"))
    model_dir, prompts = prepare(workdir, args.shape, args.prompts)
    timings = {
        "a  pipeline (arrival order)": run_ours(model_dir, prompts, args.new_tokens, workdir, False),
        "a' pipeline --group-by-length": run_ours(model_dir, prompts, args.new_tokens, workdir, True),
        "b  plain batched generate loop": run_plain_loop(model_dir, prompts, args.new_tokens),
    }
    if args.shape.startswith("causal"):  # the guide's recipe is seq2seq's (make_tensor_model_fn on a T5)
        rates = {name: args.prompts / seconds for name, seconds in timings.items()}
        print(f"\n{args.prompts} prompts, {args.new_tokens} new tokens, {args.shape} (Llama-shaped), batch {BATCH_SIZE}")
        for name, seconds in timings.items():
            print(f"  {name:<32} {seconds:7.1f} s  {rates[name]:7.2f} prompts/s")
        b = rates["b  plain batched generate loop"]
        print(f"  a/b  = {rates['a  pipeline (arrival order)'] / b:.2f}  (target >= 0.8)")
        grouped = rates["a' pipeline --group-by-length"]
        print(f"  a'/b = {grouped / b:.2f}")
        return
    timings["c  guide recipe, batch size 1"] = run_guide_recipe(model_dir, prompts, args.new_tokens, workdir)
    rates = {name: args.prompts / seconds for name, seconds in timings.items()}
    print(f"\n{args.prompts} prompts, {args.new_tokens} new tokens, t5-{args.shape} shape, batch {BATCH_SIZE}")
    for name, seconds in timings.items():
        print(f"  {name:<32} {seconds:7.1f} s  {rates[name]:7.2f} prompts/s")
    a, a2 = rates["a  pipeline (arrival order)"], rates["a' pipeline --group-by-length"]
    b, c = rates["b  plain batched generate loop"], rates["c  guide recipe, batch size 1"]
    print(f"  a/b  = {a / b:.2f}  (target >= 0.8)")
    print(f"  a/c  = {a / c:.2f}  (target >= 3)")
    print(f"  a'/b = {a2 / b:.2f}   a'/c = {a2 / c:.2f}")


if __name__ == "__main__":
    main()
