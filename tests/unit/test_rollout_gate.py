"""gpuflow.runs.rollout_gate: the figures of two versions' answers to an evaluation set, and the gate's decision."""

import json

import pytest

from gpuflow.configuration.model import ConfigError, RolloutConfig
from gpuflow.runs.rollout_gate import (
    EvalPrompt,
    decide,
    eval_rounds,
    latency_pairs,
    parse_eval_set,
    percentile,
    report_markdown,
    score,
    set_size_needed,
)

pytestmark = pytest.mark.timeout(60)

PROMPTS = [EvalPrompt(id=f"p{i}", prompt=f"question {i}") for i in range(10)]


def answers(texts: list[str], latency_s: float | list[float] = 0.1, batch_size: int = 2, tokens: int = 6,
            rounds: int = 5) -> list[dict]:
    """Answer lines as the evaluation writes them: the set in batches of ``batch_size``, ``rounds`` times over; each
    batch's time from ``latency_s`` (one for all, or one per batch in running order)."""
    per_round = -(-len(texts) // batch_size)
    times = latency_s if isinstance(latency_s, list) else [latency_s] * (rounds * per_round)
    return [{"id": f"p{i}", "response": text, "latency_s": times[number * per_round + i // batch_size],
             "batch_size": batch_size, "response_tokens": tokens, "batch": f"r{number}b{i // batch_size}",
             "round": number, "batch_index": i // batch_size}
            for number in range(rounds) for i, text in enumerate(texts)]


SERVED = [f"answer number {i}" for i in range(10)]


def test_the_same_answers_are_promoted_with_equal_scores():
    decision = decide(RolloutConfig(), PROMPTS, ("m@new", answers(SERVED)), ("m@old", answers(SERVED)))
    assert decision.decision == "promote", decision.why
    assert decision.candidate.mean_score == decision.serving.mean_score == 1.0
    assert decision.candidate.p95_latency_s == decision.serving.p95_latency_s == 0.1
    # 10 prompts in batches of 2, 5 rounds: 25 batches, the first dropped (rollout.warmup_batches 1)
    assert len(decision.pairs) == decision.candidate.batches == 24 and decision.median_latency_ratio == 1.0
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
    assert "ratio 4.0" in decision.why and "rollout.max_latency_ratio 1.5" in decision.why


def test_within_the_bounds_is_promoted():
    slightly = decide(RolloutConfig(max_latency_ratio=1.5), PROMPTS, ("m@new", answers(SERVED, latency_s=0.14)),
                      ("m@old", answers(SERVED, latency_s=0.1)))
    assert slightly.decision == "promote", slightly.why


def test_references_score_both_versions_and_a_missing_answer_scores_zero():
    prompts = [EvalPrompt(id="a", prompt="capital of france?", reference="Paris"),
               EvalPrompt(id="b", prompt="2+2?", reference="4")]
    serving = [{"id": "a", "response": "paris", "latency_s": 0.1}, {"id": "b", "response": "4", "latency_s": 0.1}]
    candidate = [{"id": "a", "response": "It is Paris.", "latency_s": 0.1}]  # b was dead-lettered
    decision = decide(RolloutConfig(score="contains"), prompts, ("new", candidate), ("old", serving))
    assert (decision.serving.mean_score, decision.candidate.mean_score) == (1.0, 0.5)
    assert decision.refused


def test_no_latency_in_the_answers_is_not_checked_and_refused():
    without = [{k: v for k, v in answer.items() if k != "latency_s"} for answer in answers(SERVED)]
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
    assert "| p95 batch latency (s) | 0.1 | 0.4 |" in page and "refuse" in page and "m@old" in page
    assert "Median latency ratio (candidate/serving): 4.0, over 24 paired batches" in page
    assert "| r0b1 | 0.1 | 0.4 | 4.0 |" in page and "| r0b0 |" not in page  # (the warm-up batch)


def test_a_run_cannot_set_the_gate():
    from gpuflow.configuration.loading import load_config
    from gpuflow.runs.run_policy import refusal

    base = load_config("configs/local.yaml")
    for dotted, value in (("rollout.max_score_drop", 1.0), ("rollout.max_latency_ratio", 100.0),
                          ("rollout.eval_set", "gs://b/easy.jsonl"), ("rollout.score", "contains"),
                          ("rollout.min_latency_pairs", 1), ("rollout.warmup_batches", 0), ("rollout.max_rounds", 1)):
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
    from gpuflow.configuration.model import RolloutConfig

    shown = "; ".join(f"rollout.{name} = {field.default}" for name, field in RolloutConfig.model_fields.items())
    assert f"Set in the file only, never by a run: {shown}" in description  # every setting of the gate
    assert not [key for key in params if key.startswith("rollout__")]  # no field: a conf naming one is refused


# The latency statistic, on recorded pairs: the median of per-batch ratios, after the warm-up batches.

#: Batch times of one version (s), as a two-core machine under load gives them: mostly ~0.2 s, some spikes.
STEADY = [0.21, 0.19, 0.2, 0.22, 0.18, 0.2, 0.21, 0.19, 0.2, 0.2, 0.23, 0.19, 0.2, 0.21, 0.2, 0.18, 0.22, 0.2,
          0.19, 0.21, 0.2, 0.2, 0.21, 0.19, 0.2]


def test_the_same_weights_with_load_spikes_on_one_side_are_promoted():
    # The candidate's batches 3, 8 and 15 ran while a neighbour spiked (8x), and its first batch loaded lazily
    spiked = [t * 8 if number in (3, 8, 15) else t for number, t in enumerate(STEADY)]
    spiked[0] = 2.5
    decision = decide(RolloutConfig(), PROMPTS, ("m@new", answers(SERVED, latency_s=spiked)),
                      ("m@old", answers(SERVED, latency_s=STEADY)))
    assert decision.decision == "promote", decision.why
    assert decision.median_latency_ratio == 1.0 and len(decision.pairs) == 24
    assert decision.candidate.p95_latency_s > 1.5 * decision.serving.p95_latency_s  # (what p95 would have refused)


def test_a_consistent_4x_slowdown_is_refused():
    slower = [t * 4 * (1.1 if number % 3 else 0.9) for number, t in enumerate(STEADY)]
    slower[5] = 0.2  # (one batch the serving version ran in a spike)
    decision = decide(RolloutConfig(), PROMPTS, ("m@new", answers(SERVED, latency_s=slower)),
                      ("m@old", answers(SERVED, latency_s=STEADY)))
    assert decision.refused and decision.why.startswith("latency: ")
    assert 3.5 < decision.median_latency_ratio < 4.5 and "over 24 paired batches" in decision.why


def test_fewer_pairs_than_the_minimum_is_not_checked_and_names_the_set_size_needed():
    settings = RolloutConfig(min_latency_pairs=8, warmup_batches=1, max_rounds=2)
    # 10 prompts in batches of 4: 3 batches a round, 2 rounds at most: 6 batches, 5 after the warm-up one
    assert eval_rounds(settings, 10, 4) == 2
    assert set_size_needed(settings, 4) == 17  # 5 batches of 4 a round: 10 batches, 9 after the warm-up
    decision = decide(settings, PROMPTS, ("m@new", answers(SERVED, batch_size=4, rounds=2)),
                      ("m@old", answers(SERVED, batch_size=4, rounds=2)), batch_size=4)
    assert decision.refused and len(decision.pairs) == 5
    assert "latency not checked: 5 batches" in decision.why and "rollout.min_latency_pairs 8" in decision.why
    assert "at least 17 prompts (this one has 10, in batches of 4" in decision.why


def test_the_rounds_reach_the_minimum_within_the_cap():
    settings = RolloutConfig()  # 8 pairs, 1 warm-up batch, at most 20 rounds
    assert (eval_rounds(settings, 12, 16), eval_rounds(settings, 12, 8), eval_rounds(settings, 200, 8)) == (9, 5, 1)
    assert eval_rounds(RolloutConfig(max_rounds=3), 12, 16) == 3 and set_size_needed(settings, 16) == 1


def test_the_warm_up_batches_are_dropped_on_both_sides():
    cold = [*([2.0] * 2), *STEADY[2:]]  # the candidate's first two batches paid for loading
    for warmup, promoted in ((2, True), (0, True)):
        decision = decide(RolloutConfig(warmup_batches=warmup), PROMPTS, ("new", answers(SERVED, latency_s=cold)),
                          ("old", answers(SERVED, latency_s=STEADY)))
        assert (decision.decision == "promote") is promoted and len(decision.pairs) == 25 - warmup
        assert [pair.batch for pair in decision.pairs][:1] == [f"r0b{warmup}"]
    # Dropped, the cold batches count in neither version's figures
    dropped = decide(RolloutConfig(warmup_batches=2), PROMPTS, ("new", answers(SERVED, latency_s=cold)),
                     ("old", answers(SERVED, latency_s=STEADY)))
    assert dropped.candidate.p95_latency_s < 1.0 and dropped.candidate.batches == 23


def test_batches_are_paired_by_key_not_by_order():
    serving = answers(SERVED, latency_s=0.2, rounds=2)
    # The candidate's job wrote its lines in another order, and missed batch r1b3 (its prompts dead-lettered)
    candidate = [line for line in reversed(answers(SERVED, latency_s=0.3, rounds=2)) if line["batch"] != "r1b3"]
    pairs = latency_pairs(serving, candidate, warmup=1)
    assert [pair.batch for pair in pairs] == [f"r{r}b{b}" for r in (0, 1) for b in range(5)
                                              if (r, b) not in ((0, 0), (1, 3))]
    assert all((pair.serving_s, pair.candidate_s) == (0.2, 0.3) for pair in pairs)


def test_scores_use_the_first_round_only():
    later = [line if line["round"] == 0 else {**line, "response": "garbled"} for line in answers(SERVED)]
    decision = decide(RolloutConfig(), PROMPTS, ("new", later), ("old", answers(SERVED)))
    assert decision.decision == "promote" and decision.candidate.mean_score == 1.0
    assert decision.candidate.answered == 10


def test_the_local_evaluations_processor_time_is_paired_rather_than_its_wall_time():
    """Locally each batch also carries its processor time on one thread (cpu_s): the weights' work, which a
    neighbour's load does not change. Wall times that a loaded machine made 3 times longer on the candidate's side
    refuse nothing when the processor times are equal; on Dataflow (no cpu_s) the wall time is what is paired."""
    serving = [{**line, "cpu_s": 0.025} for line in answers(SERVED, latency_s=0.08)]
    candidate = [{**line, "cpu_s": 0.026} for line in answers(SERVED, latency_s=0.24)]
    local = decide(RolloutConfig(), PROMPTS, ("new", candidate), ("old", serving))
    assert local.decision == "promote" and local.median_latency_ratio == 1.04, local.why
    assert all((pair.serving_s, pair.candidate_s) == (0.025, 0.026) for pair in local.pairs)
    wall = decide(RolloutConfig(), PROMPTS, ("new", answers(SERVED, latency_s=0.24)),
                  ("old", answers(SERVED, latency_s=0.08)))
    assert wall.refused and wall.median_latency_ratio == 3.0
