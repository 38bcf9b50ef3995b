"""A lasting deployment's rollout gate: the figures of two versions' answers to the same evaluation set, and whether
the candidate may take the traffic (``rollout.*`` bounds). Pure: ``gpuflow.steps.evaluation`` runs the jobs and
reads their answers.

Each prompt is scored the configured way (``rollout.score``): against its reference when the set gives one, or else
by the candidate's agreement with the serving version's answer (the serving version agrees with itself: 1). The
gate is the one Argo Rollouts' analysis and Spinnaker's Kayenta run on a canary, on the evaluation set instead of
live traffic: promote only when the candidate's mean score and p95 latency are within the bounds of the serving
version's. A figure that could not be read (no latency in the answers, no prompt answered) refuses the candidate:
it is never taken as a pass.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from gpuflow.configuration.model import ConfigError, RolloutConfig

#: One answer line of a batch job (llm_inference.py): id, response, latency_s, batch_size, response_tokens, ...
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


class VersionFigures(BaseModel):
    """One version's answers to the evaluation set, summed up."""

    version: str
    prompts: int  # the prompts it was scored on
    answered: int
    mean_score: float | None
    p50_latency_s: float | None
    p95_latency_s: float | None
    tokens_per_s: float | None


def figures(version: str, scores: dict[str, float], answers: dict[str, Answer]) -> VersionFigures:
    """A version's figures from its per-prompt scores and its answers (as the batch job writes them: latency_s is
    the time its batch took, shared by the batch_size prompts in it)."""
    latencies = [float(answer["latency_s"]) for answer in answers.values() if answer.get("latency_s") is not None]
    busy = sum(float(answer["latency_s"]) / max(1, int(answer.get("batch_size") or 1))
               for answer in answers.values() if answer.get("latency_s") is not None)
    tokens = sum(int(answer.get("response_tokens") or 0) for answer in answers.values())
    return VersionFigures(
        version=version, prompts=len(scores), answered=len(answers),
        mean_score=round(sum(scores.values()) / len(scores), 4) if scores else None,
        p50_latency_s=round(percentile(latencies, 0.5), 6) if latencies else None,
        p95_latency_s=round(percentile(latencies, 0.95), 6) if latencies else None,
        tokens_per_s=round(tokens / busy, 2) if busy > 0 else None)


class GateDecision(BaseModel):
    """What the gate decided, with both versions' figures: the evaluate task's XCom and the deployment's record."""

    decision: Literal["promote", "refuse", "skipped"]
    why: str
    score: str  # rollout.score
    max_score_drop: float
    max_latency_ratio: float
    serving: VersionFigures | None = None
    candidate: VersionFigures | None = None

    @property
    def refused(self) -> bool:
        return self.decision == "refuse"


def _answer_text(answers: dict[str, Answer], prompt_id: str) -> str | None:
    answer = answers.get(prompt_id)
    return None if answer is None else str(answer.get("response", ""))


def decide(settings: RolloutConfig, prompts: list[EvalPrompt], candidate: tuple[str, dict[str, Answer]],
           serving: tuple[str, dict[str, Answer]] | None) -> GateDecision:
    """The gate: ``candidate`` and ``serving`` are (version, answers by prompt id); ``serving`` is None for a first
    deployment, which is scored against the references alone (none: the gate is skipped)."""
    bounds = {"score": settings.score, "max_score_drop": settings.max_score_drop,
              "max_latency_ratio": settings.max_latency_ratio}
    candidate_version, candidate_answers = candidate
    candidate_scores: dict[str, float] = {}
    serving_scores: dict[str, float] = {}
    for prompt in prompts:
        answer = _answer_text(candidate_answers, prompt.id)
        if prompt.reference is not None:
            candidate_scores[prompt.id] = 0.0 if answer is None else score(settings.score, answer, prompt.reference)
            if serving is not None:
                served = _answer_text(serving[1], prompt.id)
                serving_scores[prompt.id] = 0.0 if served is None else score(settings.score, served, prompt.reference)
        elif serving is not None and (served := _answer_text(serving[1], prompt.id)) is not None:
            candidate_scores[prompt.id] = 0.0 if answer is None else score(settings.score, answer, served)
            serving_scores[prompt.id] = 1.0  # the serving version agrees with itself
    ours = figures(candidate_version, candidate_scores, candidate_answers)
    if serving is None:
        if not candidate_scores:
            return GateDecision(decision="skipped", candidate=ours, **bounds,
                                why="a first deployment, and the evaluation set has no references: nothing to compare "
                                    "with, so the gate is skipped")
        return GateDecision(decision="promote", candidate=ours, **bounds,
                            why=f"a first deployment: scored against the set's {ours.prompts} references only "
                                f"(mean {ours.mean_score}); nothing serves to compare with")
    theirs = figures(serving[0], serving_scores, serving[1])
    problems = _bound_problems(settings, ours, theirs)
    if problems:
        return GateDecision(decision="refuse", serving=theirs, candidate=ours, **bounds, why="; ".join(problems))
    return GateDecision(decision="promote", serving=theirs, candidate=ours, **bounds,
                        why=f"within both bounds: mean score {ours.mean_score} against {theirs.mean_score}, p95 "
                            f"latency {ours.p95_latency_s}s against {theirs.p95_latency_s}s")


def _bound_problems(settings: RolloutConfig, ours: VersionFigures, theirs: VersionFigures) -> list[str]:
    problems = []
    if ours.mean_score is None or theirs.mean_score is None:
        problems.append("not checked: no prompt of the evaluation set could be scored (no reference, and the serving "
                        "version answered none)")
    elif ours.mean_score < theirs.mean_score - settings.max_score_drop - 1e-9:
        problems.append(f"score: the candidate's mean score {ours.mean_score} is below the serving version's "
                        f"{theirs.mean_score} minus rollout.max_score_drop {settings.max_score_drop} "
                        f"(= {round(theirs.mean_score - settings.max_score_drop, 4)})")
    if ours.p95_latency_s is None or theirs.p95_latency_s is None:
        problems.append("latency not checked: the answers carry no latency_s (the vLLM engine measures none)")
    elif ours.p95_latency_s > theirs.p95_latency_s * settings.max_latency_ratio:
        problems.append(f"latency: the candidate's p95 latency {ours.p95_latency_s}s is above the serving version's "
                        f"{theirs.p95_latency_s}s times rollout.max_latency_ratio {settings.max_latency_ratio} "
                        f"(= {round(theirs.p95_latency_s * settings.max_latency_ratio, 6)}s)")
    return problems


def report_markdown(decision: GateDecision, deployment: str, run_id: str) -> str:
    """The decision and both versions side by side, as the dag run's note shows it."""
    rows = [("version", "version"), ("prompts scored", "prompts"), ("answered", "answered"),
            (f"mean score ({decision.score})", "mean_score"), ("p50 latency (s)", "p50_latency_s"),
            ("p95 latency (s)", "p95_latency_s"), ("tokens/s", "tokens_per_s")]
    versions = [("serving", decision.serving), ("candidate", decision.candidate)]

    def cell(figures: VersionFigures | None, field: str) -> str:
        value = None if figures is None else getattr(figures, field)
        return "–" if value is None else str(value)

    lines = [f"**Rollout gate of deployment {deployment}: {decision.decision}** ({run_id})", "",
             f"{decision.why}", "", "| | " + " | ".join(name for name, _ in versions) + " |", "| --- | --- | --- |"]
    lines += [f"| {label} | " + " | ".join(cell(figures, field) for _, figures in versions) + " |"
              for label, field in rows]
    lines += ["", f"Bounds: rollout.max_score_drop {decision.max_score_drop}, rollout.max_latency_ratio "
                  f"{decision.max_latency_ratio}."]
    return "\n".join(lines)
