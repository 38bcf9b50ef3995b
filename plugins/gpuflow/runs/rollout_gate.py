"""A lasting deployment's rollout gate: the figures of two versions' answers to the same evaluation set, and whether
the candidate may take the traffic (``rollout.*`` bounds). Pure: ``gpuflow.steps.evaluation`` runs the jobs and
reads their answers.

Each prompt is scored the configured way (``rollout.score``): against its reference when the set gives one, or else
by the candidate's agreement with the serving version's answer (the serving version agrees with itself: 1). The
gate is the one Argo Rollouts' analysis and Spinnaker's Kayenta run on a canary, on the evaluation set instead of
live traffic: promote only when the candidate's mean score is within ``rollout.max_score_drop`` of the serving
version's, and the median of its per-batch latency ratios within ``rollout.max_latency_ratio``.

Latency is measured on weights, not on the moment: both versions run the same batches (keyed ``r<round>b<index>``),
locally interleaved in one process, and the set runs several rounds so that at least ``rollout.min_latency_pairs``
batches pair up after the warm-up ones. One batch slowed by a neighbour's load moves a median of ratios little; a
version slower on every batch moves it all. A figure that could not be read (no latency in the answers, too few
pairs, no prompt answered) refuses the candidate: it is never taken as a pass.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from gpuflow.configuration.model import ConfigError, RolloutConfig

#: One answer line of an evaluation (llm_inference.py, evaluate_interleaved.py): id, response, latency_s, batch_size,
#: response_tokens, ..., and its batch's key, round and index (batch, round, batch_index).
Answer = dict[str, Any]


class EvalPrompt(BaseModel):
    id: str
    prompt: str
    reference: str | None = None


def parse_eval_set(text: str, source: str) -> list[EvalPrompt]:
    """The evaluation set's lines; a bad one is an error naming its line (the set is the site's own file, so it
    is fixed, not dead-lettered)."""
    prompts, seen = [], set()
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            prompt = EvalPrompt.model_validate(json.loads(line))
        except (json.JSONDecodeError, ValidationError) as error:
            raise ConfigError(f"rollout.eval_set {source}, line {number}: not a JSON object with a string id and "
                              f"prompt and an optional string reference ({str(error).splitlines()[0]}). Fix: "
                              "correct that line (docs/deployment.md, \"The rollout gate\").") from None
        if prompt.id in seen:
            raise ConfigError(f"rollout.eval_set {source}, line {number}: id {prompt.id!r} appears twice. Fix: give "
                              "each prompt its own id.")
        seen.add(prompt.id)
        prompts.append(prompt)
    if not prompts:
        raise ConfigError(f"rollout.eval_set {source} holds no prompt. Fix: write one JSON object per line.")
    return prompts


def _normalized(text: str) -> str:
    return " ".join(text.split()).casefold()


def score(how: str, answer: str, reference: str) -> float:
    """One answer against its reference: exact, contains (case and spacing aside), or ROUGE-L's F1 (Google
    Research's rouge-score, the implementation Hugging Face's ``evaluate`` also wraps)."""
    if how == "exact":
        return float(_normalized(answer) == _normalized(reference))
    if how == "contains":
        return float(_normalized(reference) in _normalized(answer))
    from rouge_score import rouge_scorer

    if not re.search(r"[a-z0-9]", reference.lower()) and not re.search(r"[a-z0-9]", answer.lower()):
        return float(_normalized(answer) == _normalized(reference))  # (its tokenizer keeps letters and digits only)
    return float(rouge_scorer.RougeScorer(["rougeL"]).score(reference, answer)["rougeL"].fmeasure)


def percentile(values: list[float], fraction: float) -> float:
    """The nearest-rank percentile: the smallest value that at least ``fraction`` of the values do not exceed."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def eval_rounds(settings: RolloutConfig, set_size: int, batch_size: int) -> int:
    """How many times the set runs: enough rounds for ``min_latency_pairs`` batches after the warm-up ones, at most
    ``max_rounds``."""
    per_round = math.ceil(set_size / max(1, batch_size))
    wanted = math.ceil((settings.min_latency_pairs + settings.warmup_batches) / max(1, per_round))
    return max(1, min(settings.max_rounds, wanted))


def set_size_needed(settings: RolloutConfig, batch_size: int) -> int:
    """The smallest set whose ``max_rounds`` rounds give ``min_latency_pairs`` batches after the warm-up ones."""
    per_round = math.ceil((settings.min_latency_pairs + settings.warmup_batches) / settings.max_rounds)
    return (per_round - 1) * batch_size + 1


def first_round(answers: list[Answer]) -> dict[str, Answer]:
    """The answers that are scored, by prompt id: the first round's (a later round asks the same again)."""
    return {str(answer["id"]): answer for answer in answers if int(answer.get("round") or 0) == 0}


def batch_seconds(answer: Answer) -> float | None:
    """What an answer's batch cost: its processor time (``cpu_s``) where the evaluation measured one (the local
    profile's interleaved evaluation, on one thread: the weights' work, whatever the machine's load), else its wall
    time (``latency_s``: a Dataflow job's batch, on workers of its own)."""
    seconds = answer.get("cpu_s", answer.get("latency_s"))
    return None if seconds is None else float(seconds)


def batch_latencies(answers: list[Answer], warmup: int) -> dict[str, float]:
    """Each batch's time by its key, in the order the batches ran, the first ``warmup`` dropped (the first batch
    pays for lazy loading and cold caches, in one version's measurement, not in its weights). Answers without a
    batch key or latency (the vLLM engine's) give none."""
    times: dict[tuple[int, int], tuple[str, float]] = {}
    for answer in answers:
        seconds = batch_seconds(answer)
        if answer.get("batch") is None or seconds is None:
            continue
        order = (int(answer.get("round") or 0), int(answer.get("batch_index") or 0))
        times[order] = (str(answer["batch"]), max(seconds, times.get(order, ("", 0.0))[1]))
    return dict(times[order] for order in sorted(times)[warmup:])


class VersionFigures(BaseModel):
    """One version's answers to the evaluation set, summed up: scores on the first round, times per batch over the
    measured batches (the warm-up ones dropped)."""

    version: str
    prompts: int  # the prompts it was scored on
    answered: int
    mean_score: float | None
    p50_latency_s: float | None
    p95_latency_s: float | None
    tokens_per_s: float | None
    batches: int = 0  # the batches measured


def figures(version: str, scores: dict[str, float], answers: list[Answer], warmup: int = 0) -> VersionFigures:
    """A version's figures from its per-prompt scores and its answers (as the evaluation writes them: latency_s is
    the time its batch took, shared by the batch_size prompts in it). Answers without a batch key count each
    line's latency."""
    latencies = list(batch_latencies(answers, warmup).values()) or [
        float(answer["latency_s"]) for answer in answers
        if answer.get("batch") is None and answer.get("latency_s") is not None]
    busy = sum(float(answer["latency_s"]) / max(1, int(answer.get("batch_size") or 1))
               for answer in answers if answer.get("latency_s") is not None)
    tokens = sum(int(answer.get("response_tokens") or 0) for answer in answers)
    return VersionFigures(
        version=version, prompts=len(scores), answered=len(first_round(answers)),
        mean_score=round(sum(scores.values()) / len(scores), 4) if scores else None,
        p50_latency_s=round(percentile(latencies, 0.5), 6) if latencies else None,
        p95_latency_s=round(percentile(latencies, 0.95), 6) if latencies else None,
        tokens_per_s=round(tokens / busy, 2) if busy > 0 else None, batches=len(latencies))


class LatencyPair(BaseModel):
    """One batch's time in each version: the same prompts, the same generation settings, the same moment."""

    batch: str
    serving_s: float
    candidate_s: float

    @property
    def ratio(self) -> float:
        return self.candidate_s / self.serving_s if self.serving_s > 0 else math.inf


def latency_pairs(serving: list[Answer], candidate: list[Answer], warmup: int) -> list[LatencyPair]:
    """The batches both versions measured, paired by key (in the serving version's order)."""
    theirs, ours = batch_latencies(serving, warmup), batch_latencies(candidate, warmup)
    return [LatencyPair(batch=key, serving_s=seconds, candidate_s=ours[key])
            for key, seconds in theirs.items() if key in ours]


class GateDecision(BaseModel):
    """What the gate decided, with both versions' figures and the paired batch times: the evaluate task's XCom and
    the deployment's record."""

    decision: Literal["promote", "refuse", "skipped"]
    why: str
    score: str  # rollout.score
    max_score_drop: float
    max_latency_ratio: float
    min_latency_pairs: int = 0
    warmup_batches: int = 0
    serving: VersionFigures | None = None
    candidate: VersionFigures | None = None
    pairs: list[LatencyPair] = []
    median_latency_ratio: float | None = None  # the median of candidate_s / serving_s over the pairs

    @property
    def refused(self) -> bool:
        return self.decision == "refuse"


def _answer_text(answers: dict[str, Answer], prompt_id: str) -> str | None:
    answer = answers.get(prompt_id)
    return None if answer is None else str(answer.get("response", ""))


def decide(settings: RolloutConfig, prompts: list[EvalPrompt], candidate: tuple[str, list[Answer]],
           serving: tuple[str, list[Answer]] | None, batch_size: int | None = None) -> GateDecision:
    """The gate: ``candidate`` and ``serving`` are (version, answer lines of every round); ``serving`` is None for a
    first deployment, which is scored against the references alone (none: the gate is skipped). ``batch_size``
    (the evaluation's fixed batch) sizes the set that a refusal for too few pairs asks for."""
    bounds = {"score": settings.score, "max_score_drop": settings.max_score_drop,
              "max_latency_ratio": settings.max_latency_ratio, "min_latency_pairs": settings.min_latency_pairs,
              "warmup_batches": settings.warmup_batches}
    candidate_version, candidate_answers = candidate
    ours_first = first_round(candidate_answers)
    theirs_first = first_round(serving[1]) if serving is not None else {}
    candidate_scores: dict[str, float] = {}
    serving_scores: dict[str, float] = {}
    for prompt in prompts:
        answer = _answer_text(ours_first, prompt.id)
        if prompt.reference is not None:
            candidate_scores[prompt.id] = 0.0 if answer is None else score(settings.score, answer, prompt.reference)
            if serving is not None:
                served = _answer_text(theirs_first, prompt.id)
                serving_scores[prompt.id] = 0.0 if served is None else score(settings.score, served, prompt.reference)
        elif serving is not None and (served := _answer_text(theirs_first, prompt.id)) is not None:
            candidate_scores[prompt.id] = 0.0 if answer is None else score(settings.score, answer, served)
            serving_scores[prompt.id] = 1.0  # the serving version agrees with itself
    warmup = settings.warmup_batches
    ours = figures(candidate_version, candidate_scores, candidate_answers, warmup)
    if serving is None:
        if not candidate_scores:
            return GateDecision(decision="skipped", candidate=ours, **bounds,
                                why="a first deployment, and the evaluation set has no references: nothing to compare "
                                    "with, so the gate is skipped")
        return GateDecision(decision="promote", candidate=ours, **bounds,
                            why=f"a first deployment: scored against the set's {ours.prompts} references only "
                                f"(mean {ours.mean_score}); nothing serves to compare with")
    theirs = figures(serving[0], serving_scores, serving[1], warmup)
    pairs = latency_pairs(serving[1], candidate_answers, warmup)
    ratio = round(statistics.median(pair.ratio for pair in pairs), 4) if pairs else None
    size = batch_size or max((int(a.get("batch_size") or 1) for a in candidate_answers), default=1)
    problems = _bound_problems(settings, ours, theirs, pairs, ratio, len(prompts), size)
    kept = {"serving": theirs, "candidate": ours, "pairs": pairs, "median_latency_ratio": ratio, **bounds}
    if problems:
        return GateDecision(decision="refuse", **kept, why="; ".join(problems))
    return GateDecision(decision="promote", **kept,
                        why=f"within both bounds: mean score {ours.mean_score} against {theirs.mean_score}, median "
                            f"latency ratio {ratio} over {len(pairs)} paired batches")


def _bound_problems(settings: RolloutConfig, ours: VersionFigures, theirs: VersionFigures, pairs: list[LatencyPair],
                    ratio: float | None, set_size: int, batch_size: int) -> list[str]:
    problems = []
    if ours.mean_score is None or theirs.mean_score is None:
        problems.append("not checked: no prompt of the evaluation set could be scored (no reference, and the serving "
                        "version answered none)")
    elif ours.mean_score < theirs.mean_score - settings.max_score_drop - 1e-9:
        problems.append(f"score: the candidate's mean score {ours.mean_score} is below the serving version's "
                        f"{theirs.mean_score} minus rollout.max_score_drop {settings.max_score_drop} "
                        f"(= {round(theirs.mean_score - settings.max_score_drop, 4)})")
    if ours.p50_latency_s is None or theirs.p50_latency_s is None:
        problems.append("latency not checked: the answers carry no latency_s (the vLLM engine measures none)")
    elif ratio is None or len(pairs) < settings.min_latency_pairs:
        problems.append(
            f"latency not checked: {len(pairs)} batches measured by both versions (paired by batch key, after "
            f"rollout.warmup_batches {settings.warmup_batches}), fewer than rollout.min_latency_pairs "
            f"{settings.min_latency_pairs}. Fix: an evaluation set of at least "
            f"{max(set_size + 1, set_size_needed(settings, batch_size))} prompts (this one has {set_size}, in batches "
            f"of {batch_size}, run at most rollout.max_rounds {settings.max_rounds} times)")
    elif ratio > settings.max_latency_ratio:
        problems.append(f"latency: the candidate's median per-batch latency ratio {ratio} (candidate/serving over "
                        f"{len(pairs)} paired batches; median batch {ours.p50_latency_s}s against "
                        f"{theirs.p50_latency_s}s) is above rollout.max_latency_ratio {settings.max_latency_ratio}")
    return problems


def report_markdown(decision: GateDecision, deployment: str, run_id: str) -> str:
    """The decision, both versions side by side and each paired batch's times: the page in the deployment's
    folder (Airflow 3's task SDK cannot write a DAG run's note, so the page is where a person reads it)."""
    rows = [("version", "version"), ("prompts scored", "prompts"), ("answered", "answered"),
            (f"mean score ({decision.score})", "mean_score"), ("batches measured", "batches"),
            ("p50 batch latency (s)", "p50_latency_s"), ("p95 batch latency (s)", "p95_latency_s"),
            ("tokens/s", "tokens_per_s")]
    versions = [("serving", decision.serving), ("candidate", decision.candidate)]

    def cell(figures: VersionFigures | None, field: str) -> str:
        value = None if figures is None else getattr(figures, field)
        return "–" if value is None else str(value)

    lines = [f"**Rollout gate of deployment {deployment}: {decision.decision}** ({run_id})", "",
             f"{decision.why}", "", "| | " + " | ".join(name for name, _ in versions) + " |", "| --- | --- | --- |"]
    lines += [f"| {label} | " + " | ".join(cell(figures, field) for _, figures in versions) + " |"
              for label, field in rows]
    if decision.pairs:
        lines += ["", f"Median latency ratio (candidate/serving): {decision.median_latency_ratio}, over "
                      f"{len(decision.pairs)} paired batches:", "",
                  "| batch | serving (s) | candidate (s) | ratio |", "| --- | --- | --- | --- |"]
        lines += [f"| {pair.batch} | {pair.serving_s} | {pair.candidate_s} | {round(pair.ratio, 3)} |"
                  for pair in decision.pairs]
    lines += ["", f"Bounds: rollout.max_score_drop {decision.max_score_drop}, rollout.max_latency_ratio "
                  f"{decision.max_latency_ratio} (median of at least rollout.min_latency_pairs "
                  f"{decision.min_latency_pairs} paired batches, after rollout.warmup_batches "
                  f"{decision.warmup_batches})."]
    return "\n".join(lines)
