"""The rollout gate's evaluation on one machine: the serving version and the candidate in ONE process, their batches
interleaved (serving batch 1, candidate batch 1, candidate batch 2, serving batch 2, ...), so that a neighbour's
load or a cold cache falls on both versions' measurement of the same batch instead of on one version's whole run.

Two batch jobs one after the other measured the moment, not the weights: with a small set, a version's p95 was one
batch's time. Here both versions run the same batches (the set sorted by id, cut into ``--batch-size``), the whole
set ``--rounds`` times, through the batch pipeline's own code: llm_inference.py's arguments and model handler
(``GenerateHandler``: Beam's ModelHandler ``load_model`` and ``run_inference``), prompt_io.py's parsing, validation
and routing. Each version's answers go where its batch job would write them (responses.jsonl, dead_letters.jsonl,
summary.json), each line with its batch's key, round and index; gpuflow.runs.rollout_gate pairs the batches by key.
The order within a pair alternates, so neither version always runs second, on caches the other warmed.

What the gate compares here is each batch's processor time (``cpu_s``, beside the wall time ``latency_s``), with
torch on one thread: the work the weights cost, which is what a version's latency is on a machine of its own. A
neighbour's load (this machine's other tests, its serving pipeline) changes a batch's wall time, not that work.

It starts as ``llm_inference.py --interleaved-evaluation --rounds N --batch-size B --version JSON --version JSON``
(each JSON: that version's llm_inference.py batch arguments), so the local platform starts, finds and stops it as
any of its pipeline processes. The Dataflow jobs use ``FixedBatchHandler`` and ``fixed_batches`` from here.
"""

import argparse
import json
import logging
import os
import time
from collections.abc import Iterable, Sequence
from typing import Any

from apache_beam.ml.inference.base import ModelHandler, PredictionResult

from prompt_io import PromptElement

log = logging.getLogger("gpuflow.llm_inference")

#: The flag of llm_inference.py that runs this evaluation instead of a pipeline.
INTERLEAVED_FLAG = "--interleaved-evaluation"

#: A batch of the evaluation: (key, round, index, its prompts); the key is the same for both versions.
FixedBatch = tuple[str, int, int, list[PromptElement]]


def batch_key(round_number: int, index: int) -> str:
    """The key of a round's batch: both versions run the same prompts in it (the set sorted by id, cut into batches
    of the candidate's inference.max_batch_size), so the rollout gate pairs their times by it
    (gpuflow.runs.rollout_gate.batch_latencies reads it from each answer's ``batch``)."""
    return f"r{round_number}b{index}"


def fixed_batches(elements: Iterable[PromptElement], batch_size: int, rounds: int) -> list[FixedBatch]:
    """The set sorted by id, cut into batches of ``batch_size``, ``rounds`` times over: the same batches in every job
    and every version, whatever order the prompts were read in."""
    ordered = sorted(elements, key=lambda element: element[0])
    cut = [ordered[start:start + batch_size] for start in range(0, len(ordered), max(1, batch_size))]
    return [(batch_key(number, index), number, index, batch) for number in range(rounds)
            for index, batch in enumerate(cut)]


class FixedBatchHandler(ModelHandler[FixedBatch, PredictionResult, Any]):
    """A handler's ``run_inference`` on batches formed beforehand (``fixed_batches``), one to a RunInference batch:
    Beam's BatchElements would otherwise cut each job's batches where its bundles end. Each answer's inference
    carries its batch's key, round and index after the handler's own (text, tokens, batch size, seconds)."""

    def __init__(self, inner: Any):
        super().__init__()
        self._inner = inner

    def load_model(self) -> Any:
        return self._inner.load_model()

    def batch_elements_kwargs(self) -> dict[str, Any]:
        return {"min_batch_size": 1, "max_batch_size": 1}

    def share_model_across_processes(self) -> bool:
        return bool(self._inner.share_model_across_processes())

    def model_copies(self) -> int:
        return int(self._inner.model_copies())

    def update_model_path(self, model_path: str | None = None) -> None:
        self._inner.update_model_path(model_path)

    def get_metrics_namespace(self) -> str:
        return str(self._inner.get_metrics_namespace())

    def run_inference(self, batch: Sequence[FixedBatch], model: Any,
                      inference_args: dict[str, Any] | None = None) -> Iterable[PredictionResult]:
        results = []
        for key, round_number, index, elements in batch:
            if not elements:
                continue
            for result in self._inner.run_inference(elements, model, inference_args):
                inference = result.inference if isinstance(result.inference, dict) else (
                    *result.inference, key, round_number, index)
                results.append(PredictionResult(result.example, inference, model_id=result.model_id))
        return results


def _read_lines(path: str) -> list[bytes]:
    from apache_beam.io.filesystems import FileSystems

    with FileSystems.open(path) as handle:
        return [line for line in handle.read().splitlines() if line.strip()]


def _write(path: str, text: str) -> None:
    from apache_beam.io.filesystems import FileSystems

    with FileSystems.create(path) as handle:
        handle.write(text.encode("utf-8"))


class Version:
    """One version: its batch job's arguments, handler, validated prompts, and what it answered."""

    def __init__(self, argv: list[str]):
        from llm_inference import make_model_handler, parse_args
        from prompt_io import ValidatePrompt

        self.args, _ = parse_args(argv)
        self.handler = FixedBatchHandler(make_model_handler(self.args, streaming=False))
        self.validator = ValidatePrompt(self.args.model_name, self.args.max_input_tokens, self.args.chat_template)
        self.model: Any = None
        self.prompts: dict[str, PromptElement] = {}
        self.answers: list[dict[str, Any]] = []
        self.dead_letters: list[dict[str, Any]] = []

    def prepare(self, records: list[tuple[str, str]]) -> None:
        """Its tokenizer on every prompt (dead letters as its job would write them), then its model."""
        self.validator.setup()
        for record in records:
            for out in self.validator.process(record):
                if isinstance(out, tuple):
                    self.prompts[out[0]] = out
                else:
                    self.dead_letters.append(out.value)
        started = time.monotonic()
        self.model = self.handler.load_model()
        log.info("gpuflow: evaluation of %s: model loaded in %.1fs", self.args.model_version,
                 time.monotonic() - started)

    def run(self, batch: FixedBatch) -> None:
        from prompt_io import route_prediction

        key, round_number, index, elements = batch
        mine = [self.prompts[element[0]] for element in elements if element[0] in self.prompts]
        started = time.process_time()
        results = list(self.handler.run_inference([(key, round_number, index, mine)], self.model))
        cpu_s = round(time.process_time() - started, 6)  # (one version runs at a time in this process)
        for result in results:
            for routed in route_prediction(result):
                if isinstance(routed, dict):
                    self.answers.append({**routed, "cpu_s": cpu_s})
                elif round_number == 0:  # a later round asks the same again: one dead letter per prompt
                    self.dead_letters.append(routed.value)

    def write(self, lines_in: int, rounds: int) -> None:
        from llm_inference import output_paths

        answers_path, dead_letters_path, summary_path = output_paths(self.args.output, self.args.dead_letter_output)
        first = [answer for answer in self.answers if answer.get("round") == 0]
        reasons: dict[str, int] = {}
        for letter in self.dead_letters:
            reasons[letter["reason"]] = reasons.get(letter["reason"], 0) + 1
        _write(answers_path, "".join(json.dumps(answer) + "\n" for answer in self.answers))
        _write(dead_letters_path, "".join(json.dumps(letter) + "\n" for letter in self.dead_letters))
        _write(summary_path, json.dumps({
            "lines_in": lines_in, "answered": len(first), "dead_lettered": len(self.dead_letters),
            "response_tokens": sum(int(answer.get("response_tokens") or 0) for answer in first),
            "dead_letter_reasons": dict(sorted(reasons.items())), "rounds": rounds}) + "\n")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"llm_inference.py {INTERLEAVED_FLAG}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(INTERLEAVED_FLAG, action="store_true")
    parser.add_argument("--input", required=True, help="the evaluation set (JSONL: id, prompt)")
    parser.add_argument("--rounds", type=int, default=1, help="how many times the whole set runs")
    parser.add_argument("--batch-size", type=int, required=True, help="the fixed batch (the candidate's largest)")
    parser.add_argument("--version", action="append", required=True,
                        help="a version's llm_inference.py batch arguments, as a JSON list (in running order)")
    known, _ = parser.parse_known_args(argv)  # (the runner's options, which the platform adds, are not used)
    return known


def one_compute_thread() -> None:
    """torch on one intra-op thread: each batch's processor time is then the work its weights cost, whatever else
    runs on the machine. With torch's default threads on two shared cores, the threads' spin-waits made a batch's
    processor time vary fivefold from round to round, and its wall time tenfold; on one thread, by a few percent."""
    import torch

    torch.set_num_threads(1)


def run(argv: Sequence[str]) -> list[Version]:
    """Both versions loaded, then the batches interleaved; each version's answers written where its job would."""
    from prompt_io import first_of_each_id, parse_jsonl_line

    args = parse_args(argv)
    one_compute_thread()
    if os.environ.get("STORAGE_EMULATOR_HOST"):  # the local profile only
        from storage_emulator import connect_anonymously

        connect_anonymously()
    lines = _read_lines(args.input)
    by_id: dict[str, list[str]] = {}
    for line in lines:
        for parsed in parse_jsonl_line(line):
            if isinstance(parsed, tuple):
                by_id.setdefault(parsed[0], []).append(parsed[1])
    records = [kept for grouped in by_id.items() for kept in first_of_each_id(grouped) if isinstance(kept, tuple)]
    versions = [Version(json.loads(version_argv)) for version_argv in args.version]
    for version in versions:
        version.prepare(records)
    elements: list[PromptElement] = [(prompt_id, prompt, []) for prompt_id, prompt in records]
    started = time.monotonic()
    for number, batch in enumerate(fixed_batches(elements, args.batch_size, args.rounds)):
        for version in versions if number % 2 == 0 else versions[::-1]:
            version.run(batch)
    log.info("gpuflow: evaluation of %d prompts, %d rounds, %d versions interleaved in %.1fs", len(records),
             args.rounds, len(versions), time.monotonic() - started)
    for version in versions:
        version.write(len(lines), args.rounds)
    return versions


if __name__ == "__main__":
    import sys

    logging.getLogger().setLevel(logging.INFO)
    run(sys.argv[1:])
