"""The rollout gate's latency bound under CI's load: does it tell weights apart, not moments? Run by hand:

    .venv/bin/python benchmarks/rollout_gate.py [--runs 20] [--max-new-tokens 32]

Two processes spin on the two cores for the whole run, as a neighbouring test does in CI. The local interleaved
evaluation (beam_jobs/evaluate_interleaved.py: both versions in one process, their batches interleaved, torch on one
thread, each batch's processor time; the demo set's 12 prompts in 9 rounds of one batch) runs ``--runs`` times with
identical weights, and ``--runs`` times with a candidate made 4 times slower THROUGH ITS WEIGHTS, at the same
generation settings (the same ``--max-new-tokens``). The model is gpuflow's causal demo model (its prompts hold no
end token, so the end token's row, tied between embedding and output head, changes only that token's logit): the
serving version's end-token row is fitted so that the set's answers end near a quarter of ``--max-new-tokens``, the
candidate's so that the end token stays 3 below the best token's and every answer runs to ``--max-new-tokens``. Each
run is decided by gpuflow.runs.rollout_gate at the default rollout.* settings. Required: identical weights promoted
every time, the slower candidate refused on the latency bound every time. It prints the bound, the pairs per run,
each case's counts, the decode steps each version took and the spread of the median ratio.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT / "beam_jobs")]


def spin() -> None:
    while True:
        pass


def export(model_dir: Path, target: Path) -> Path:
    """The model exported as the tests do (download_model.py local: a bf16 state_dict)."""
    import subprocess

    subprocess.run([sys.executable, str(ROOT / "beam_jobs" / "download_model.py"), "local", "--model-name",
                    str(model_dir), "--state-dict-path", str(target)], check=True, capture_output=True)
    return target


def _load(model_dir: Path, state_dict: Path):
    """The weights as the evaluation loads them on a CPU (llm_models.load_model: the bf16 export, in fp32)."""
    import torch

    from llm_models import load_model

    return load_model(str(model_dir), str(state_dict), "cpu", torch.float32, architecture="causal")


def _batch(model_dir: Path, prompts: list[str]) -> dict:
    """The set as one batch, padded as the evaluation pads it (causal: on the left, with an attention mask)."""
    from transformers import AutoTokenizer

    return dict(AutoTokenizer.from_pretrained(model_dir)(prompts, return_tensors="pt", padding=True))


def decode_steps(model_dir: Path, state_dict: Path, prompts: list[str], max_new_tokens: int) -> int:
    """The decode steps of the set's batch (greedy, as the evaluation generates): until every answer ended."""
    model, batch = _load(model_dir, state_dict), _batch(model_dir, prompts)
    output = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False, num_beams=1)
    return int(output.shape[1]) - int(batch["input_ids"].shape[1])  # (a causal model's output starts with the prompt)


def with_eos_row(exported: Path, target: Path, eos_id: int, row) -> Path:
    """The same weights, the end-of-sequence token's row set (the output head's, tied to the embedding: a causal
    prompt holds no end token, so only the end token's logit changes)."""
    import torch

    weights = torch.load(exported, weights_only=True)
    for name in ("lm_head.weight", "model.embed_tokens.weight"):
        if name in weights:
            rows = weights[name].float()
            rows[eos_id] = row
            weights[name] = rows.to(weights[name].dtype)
    torch.save(weights, target)
    return target


def ending_row(model_dir: Path, exported: Path, eos_id: int, prompts: list[str], steps: int, max_new_tokens: int):
    """An end-of-sequence row that ends every answer of the set at about its ``steps``-th decode step: the
    least-squares fit, over what the output head reads at each of the set's greedy steps (the end token held
    back), of an end logit that crosses the best other token's between steps-1 and steps. The row changes nothing
    before the end token wins, so the fit holds as fitted."""
    import torch

    model = _load(model_dir, exported)
    read: list = []
    hook = model.lm_head.register_forward_hook(lambda module, args, output: read.append(args[0][:, -1, :]))
    try:
        model.generate(**_batch(model_dir, prompts), max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                       suppress_tokens=[eos_id])
    finally:
        hook.remove()
    states = torch.stack(read, dim=1).double()
    logits = states @ model.lm_head.weight.detach().double().T
    logits[..., eos_id] = -math.inf
    step = torch.arange(states.shape[1], dtype=torch.float64)
    wanted = logits.max(dim=-1).values + (step - (steps - 0.5)).clamp(-3, 3)
    return torch.linalg.lstsq(states.reshape(-1, states.shape[-1]), wanted.reshape(-1, 1)).solution.squeeze(1).float()


def batch_steps(lines: list[dict], max_new_tokens: int) -> int:
    """A version's decode steps over its batches: each batch runs until its longest answer ended (an answer that
    ended took one step more than its tokens: its end token)."""
    longest: dict[str, int] = {}
    for line in lines:
        steps = min(max_new_tokens, int(line["response_tokens"]) + 1)
        longest[line["batch"]] = max(longest.get(line["batch"], 0), steps)
    return sum(longest.values())


def evaluate(workdir: Path, model_dir: Path, serving: Path, candidate: Path, max_new_tokens: int, rounds: int,
             batch_size: int, run: int) -> list[list[dict]]:
    """One local interleaved evaluation (in this process: its imports paid once), each version's answer lines."""
    import evaluate_interleaved

    outputs = [workdir / f"run{run}" / role for role in ("serving", "candidate")]
    argv = ["--interleaved-evaluation", "--input", str(ROOT / "configs/eval_sets/demo.jsonl"), "--rounds",
            str(rounds), "--batch-size", str(batch_size)]
    for state_dict, output, version in ((serving, outputs[0], "m@serving"), (candidate, outputs[1], "m@candidate")):
        output.mkdir(parents=True)
        argv += ["--version", json.dumps([
            "--model-name", str(model_dir), "--state-dict-path", str(state_dict), "--max-new-tokens",
            str(max_new_tokens), "--min-batch-size", str(batch_size), "--max-batch-size", str(batch_size),
            "--model-version", version, "--input", "unused", "--output", f"{output}/"])]
    evaluate_interleaved.run(argv)
    return [[json.loads(line) for line in (output / "responses.jsonl").read_text().splitlines()] for output in outputs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args()

    import logging

    logging.disable(logging.WARNING)
    from transformers import AutoConfig
    from transformers.utils import logging as hf_logging

    from gpuflow.configuration.model import RolloutConfig
    from gpuflow.platform.demo_model import write_demo_model
    from gpuflow.runs.rollout_gate import decide, eval_rounds, parse_eval_set

    hf_logging.set_verbosity_error()
    settings = RolloutConfig()
    prompts = parse_eval_set((ROOT / "configs/eval_sets/demo.jsonl").read_text(), "demo")
    batch_size = 16
    rounds = eval_rounds(settings, len(prompts), batch_size)
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(2)]
    for spinner in spinners:
        spinner.start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            model_dir = write_demo_model(workdir / "model", seed=0, architecture="causal")
            eos_id = AutoConfig.from_pretrained(model_dir).eos_token_id
            base = export(model_dir, workdir / "state_dict.pth")
            texts = [prompt.prompt for prompt in prompts]
            quarter = max(1, round(args.max_new_tokens / 4))
            # The crossing step fitted, then the one whose batch ends nearest the quarter (a few answers cross late).
            fitted = {crossing: with_eos_row(base, workdir / f"ends{crossing}.pth", eos_id, ending_row(
                model_dir, base, eos_id, texts, crossing, args.max_new_tokens)) for crossing in range(2, quarter + 1)}
            lengths = {crossing: decode_steps(model_dir, path, texts, args.max_new_tokens)
                       for crossing, path in fitted.items()}
            ends = fitted[min(lengths, key=lambda crossing: abs(lengths[crossing] - quarter))]
            runs = with_eos_row(base, workdir / "runs.pth", eos_id, ending_row(  # the end token held back
                model_dir, base, eos_id, texts, 10 * args.max_new_tokens, args.max_new_tokens))
            print(f"weights: the serving version's end-token row fitted to end the set's answers near decode step "
                  f"{quarter} of max_new_tokens {args.max_new_tokens}, the candidate's to stay 3 below the best "
                  f"token's; the set's one batch takes {decode_steps(model_dir, ends, texts, args.max_new_tokens)} and "
                  f"{decode_steps(model_dir, runs, texts, args.max_new_tokens)} decode steps")
            print(f"bound: rollout.max_latency_ratio {settings.max_latency_ratio}, median of at least "
                  f"{settings.min_latency_pairs} paired batches after {settings.warmup_batches} warm-up; the demo "
                  f"set's {len(prompts)} prompts in batches of {batch_size}: {rounds} rounds; 2 cores, 2 spinners; "
                  f"max_new_tokens {args.max_new_tokens}", flush=True)
            cases = {"identical weights": (ends, ends), "4x slower weights": (ends, runs)}
            run, begun = 0, time.monotonic()
            for case, (serving, candidate) in cases.items():
                verdicts, ratios, steps, seconds, on_latency = [], [], [0, 0], [], 0
                for _ in range(args.runs):
                    started = time.monotonic()
                    answered = evaluate(workdir, model_dir, serving, candidate, args.max_new_tokens, rounds,
                                        batch_size, run)
                    seconds.append(time.monotonic() - started)
                    run += 1
                    decision = decide(settings, prompts, ("m@candidate", answered[1]), ("m@serving", answered[0]),
                                      batch_size=batch_size)
                    verdicts.append(decision.decision)
                    on_latency += "latency: " in decision.why  # (the latency bound's own refusal, not the score's)
                    ratios.append(decision.median_latency_ratio or 0.0)
                    for side, lines in enumerate(answered):
                        steps[side] += batch_steps(lines, args.max_new_tokens)
                pairs = len(decision.pairs)
                print(f"{case}: promoted {verdicts.count('promote')}/{args.runs}, refused "
                      f"{verdicts.count('refuse')}/{args.runs} (on the latency bound {on_latency}/{args.runs}); "
                      f"{pairs} pairs a run; median latency ratio per run min {min(ratios):.3f}, median "
                      f"{statistics.median(ratios):.3f}, max {max(ratios):.3f}; "
                      f"batch decode steps serving {steps[0]}, candidate {steps[1]} (ratio "
                      f"{steps[1] / steps[0]:.2f}); {statistics.median(seconds):.1f}s a run "
                      f"(min {min(seconds):.1f}, max {max(seconds):.1f})", flush=True)
            print(f"total: {time.monotonic() - begun:.0f}s for {run} evaluations")
    finally:
        for spinner in spinners:
            spinner.terminate()


if __name__ == "__main__":
    main()
