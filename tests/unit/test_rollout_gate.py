"""gpuflow.runs.rollout_gate: the figures of two versions' answers to an evaluation set, and the gate's decision."""

import json

import pytest

from gpuflow.configuration.model import ConfigError, RolloutConfig
from gpuflow.runs.rollout_gate import (
    EvalPrompt,
    decide,
    parse_eval_set,
    percentile,
    report_markdown,
    score,
)

pytestmark = pytest.mark.timeout(60)

PROMPTS = [EvalPrompt(id=f"p{i}", prompt=f"question {i}") for i in range(10)]


def answers(texts: list[str], latency_s: float = 0.1, batch_size: int = 2, tokens: int = 6) -> dict[str, dict]:
    return {f"p{i}": {"id": f"p{i}", "response": text, "latency_s": latency_s, "batch_size": batch_size,
                      "response_tokens": tokens} for i, text in enumerate(texts)}


SERVED = [f"answer number {i}" for i in range(10)]


def test_the_same_answers_are_promoted_with_equal_scores():
    decision = decide(RolloutConfig(), PROMPTS, ("m@new", answers(SERVED)), ("m@old", answers(SERVED)))
    assert decision.decision == "promote", decision.why
    assert decision.candidate.mean_score == decision.serving.mean_score == 1.0
    assert decision.candidate.p95_latency_s == decision.serving.p95_latency_s == 0.1
    # tokens/s: each batch of 2 took 0.1 s and made 12 tokens
    assert decision.candidate.tokens_per_s == pytest.approx(120.0)


def test_answers_that_disagree_are_refused_naming_the_score_bound_and_both_figures():
    differing = [f"something else {i}" if i < 6 else text for i, text in enumerate(SERVED)]
    decision = decide(RolloutConfig(max_score_drop=0.05), PROMPTS, ("m@new", answers(differing)),
                      ("m@old", answers(SERVED)))
    assert decision.refused
    # ROUGE-L F1 of "something else i" against "answer number i": the shared digit, 1 of 3 tokens each
    assert decision.candidate.mean_score == pytest.approx(round((6 * (1 / 3) + 4) / 10, 4))
    assert "rollout.max_score_drop 0.05" in decision.why
    assert str(decision.candidate.mean_score) in decision.why and "1.0" in decision.why
    assert "latency" not in decision.why


def test_a_slower_candidate_is_refused_on_latency_with_both_figures():
    decision = decide(RolloutConfig(max_latency_ratio=1.5), PROMPTS, ("m@new", answers(SERVED, latency_s=0.4)),
                      ("m@old", answers(SERVED, latency_s=0.1)))
    assert decision.refused
    assert decision.why.startswith("latency:") and "0.4s" in decision.why and "0.1s" in decision.why
    assert "rollout.max_latency_ratio 1.5" in decision.why


def test_within_the_bounds_is_promoted():
    slightly = decide(RolloutConfig(max_latency_ratio=1.5), PROMPTS, ("m@new", answers(SERVED, latency_s=0.14)),
                      ("m@old", answers(SERVED, latency_s=0.1)))
    assert slightly.decision == "promote", slightly.why


def test_references_score_both_versions_and_a_missing_answer_scores_zero():
    prompts = [EvalPrompt(id="a", prompt="capital of france?", reference="Paris"),
               EvalPrompt(id="b", prompt="2+2?", reference="4")]
    serving = {"a": {"response": "paris", "latency_s": 0.1}, "b": {"response": "4", "latency_s": 0.1}}
    candidate = {"a": {"response": "It is Paris.", "latency_s": 0.1}}  # b was dead-lettered
    decision = decide(RolloutConfig(score="contains"), prompts, ("new", candidate), ("old", serving))
    assert (decision.serving.mean_score, decision.candidate.mean_score) == (1.0, 0.5)
    assert decision.refused


def test_no_latency_in_the_answers_is_not_checked_and_refused():
    without = {key: {k: v for k, v in answer.items() if k != "latency_s"} for key, answer in answers(SERVED).items()}
    decision = decide(RolloutConfig(), PROMPTS, ("new", without), ("old", answers(SERVED)))
    assert decision.refused and "latency not checked" in decision.why


def test_a_first_deployment_is_scored_against_the_references_alone_or_skipped():
    with_references = [EvalPrompt(id="p0", prompt="q", reference="answer number 0"), *PROMPTS[1:]]
    first = decide(RolloutConfig(), with_references, ("new", answers(SERVED)), None)
    assert (first.decision, first.candidate.prompts, first.candidate.mean_score) == ("promote", 1, 1.0)
    assert first.serving is None
    skipped = decide(RolloutConfig(), PROMPTS, ("new", answers(SERVED)), None)
    assert skipped.decision == "skipped" and "no references" in skipped.why


def test_the_scores():
    assert score("exact", "  Paris ", "paris") == 1.0 and score("exact", "Paris, France", "paris") == 0.0
    assert score("contains", "It is  PARIS.", "paris") == 1.0 and score("contains", "Lyon", "paris") == 0.0
    # ROUGE-L F1: the longest common subsequence "the capital" (2 tokens) of 4 and 6: P 1/2, R 1/3
    assert score("rouge_l", "paris is the capital", "the capital of france is paris") == pytest.approx(0.4)


def test_the_nearest_rank_percentile():
    values = [float(v) for v in range(1, 21)]
    assert (percentile(values, 0.5), percentile(values, 0.95), percentile([3.0], 0.95)) == (10.0, 19.0, 3.0)


def test_a_bad_evaluation_set_names_its_line():
    good = json.dumps({"id": "a", "prompt": "q"})
    with pytest.raises(ConfigError, match="line 2"):
        parse_eval_set(good + "\n{not json}\n", "gs://b/set.jsonl")
    with pytest.raises(ConfigError, match="line 2: id 'a' appears twice"):
        parse_eval_set(good + "\n" + good + "\n", "gs://b/set.jsonl")
    with pytest.raises(ConfigError, match="holds no prompt"):
        parse_eval_set("\n", "gs://b/set.jsonl")
    assert parse_eval_set(good + "\n\n", "x")[0].reference is None


def test_the_shipped_demo_set_parses():
    from gpuflow.paths import project_path

    prompts = parse_eval_set(project_path("configs/eval_sets/demo.jsonl").read_text(), "demo")
    assert len(prompts) >= 10 and all(prompt.reference is None for prompt in prompts)


def test_the_page_shows_both_versions_side_by_side():
    decision = decide(RolloutConfig(), PROMPTS, ("m@new", answers(SERVED, latency_s=0.4)), ("m@old", answers(SERVED)))
    page = report_markdown(decision, "chat", "manual__1")
    assert "| p95 latency (s) | 0.1 | 0.4 |" in page and "refuse" in page and "m@old" in page


def test_a_run_cannot_set_the_gate():
    from gpuflow.configuration.loading import load_config
    from gpuflow.runs.run_policy import refusal

    base = load_config("configs/local.yaml")
    for dotted, value in (("rollout.max_score_drop", 1.0), ("rollout.max_latency_ratio", 100.0),
                          ("rollout.eval_set", "gs://b/easy.jsonl"), ("rollout.score", "contains")):
        problem = refusal(dotted, value, base)
        assert problem and "only the configuration file sets it" in problem, (dotted, problem)


def test_preflight_refuses_an_evaluation_set_dataflow_workers_cannot_read():
    from gpuflow.configuration.loading import load_config
    from gpuflow.preflight import run_preflight

    def findings(eval_set: str) -> list[str]:
        config = load_config("configs/gcp.example.yaml", overrides=[
            "project=gpuflow-unit-test", "bucket=bkt", "deployment.mode=persistent", f"rollout.eval_set={eval_set}"])
        return [f.field for f in run_preflight(config, check_environment=False) if f.level == "error"]

    assert "rollout.eval_set" in findings("eval/set.jsonl")
    assert "rollout.eval_set" not in findings("gs://bkt/eval/set.jsonl")


def test_the_form_shows_the_gate_read_only():
    from tests.helpers import dag_bag

    params = dag_bag().dags["llm_streaming_inference"].params
    description = params.get_param("config_file").description
    assert "Set in the file only, never by a run: rollout.eval_set = None; rollout.score = rouge_l; " \
           "rollout.max_score_drop = 0.05; rollout.max_latency_ratio = 1.5." in description
    assert not [key for key in params if key.startswith("rollout__")]  # no field: a conf naming one is refused
