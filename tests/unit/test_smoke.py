"""The smoke test's bookkeeping between its deferrals: what the trigger pulled, rounds of a rollout, the verdict."""

import time

import pytest

from gpuflow.steps.smoke import SmokeRound, SmokeTestFailed, record_answers, smoke_test_result


def smoke_round(expect_version=None, deadline_s=60.0):
    now = time.time()
    return SmokeRound(window_start=now, deadline=now + deadline_s,
                      expect_version=expect_version, round_number=1, sent={"a": "hi", "b": "ho"})


def answer(model="v1"):
    return {"answer": "x", "latency_s": 1.0, "batch_size": 1, "model": model}


def test_every_answer_in_gives_the_rows_and_the_versions():
    state = smoke_round()
    assert record_answers(state, {"status": "success", "answers": {"a": answer(), "b": answer()}}) is False
    result = smoke_test_result(state)
    assert (result["answered"], result["sent"], result["versions"]) == (2, 2, ["v1"])


def test_a_dead_letter_or_a_missing_answer_fails_with_both_named():
    state = smoke_round()
    record_answers(state, {"status": "timeout", "answers": {}, "dead_letters": {"a": "too long"}})
    with pytest.raises(SmokeTestFailed, match=r"0/2 prompts answered; dead letters: \{'a': 'too long'\}.*\['b'\]"):
        smoke_test_result(state)


def test_a_rollout_asks_again_until_the_new_version_answers():
    state = smoke_round(expect_version="v2")
    assert record_answers(state, {"status": "success", "answers": {"a": answer("v1"), "b": answer("v1")}})
    state.sent.update({"c": "hi"})
    assert not record_answers(state, {"status": "success", "answers": {"c": answer("v2")}})
    assert smoke_test_result(state)["versions"] == ["v1", "v2"]


def test_a_rollout_out_of_time_stops_asking_and_says_the_new_version_never_answered():
    state = smoke_round(expect_version="v2", deadline_s=-1)
    assert not record_answers(state, {"status": "success", "answers": {"a": answer("v1"), "b": answer("v1")}})
    with pytest.raises(SmokeTestFailed, match="never by the new version v2"):
        smoke_test_result(state)


def test_a_failed_pull_fails_with_the_fix():
    with pytest.raises(SmokeTestFailed, match="subscriptions exist"):
        record_answers(smoke_round(), {"status": "error", "message": "pulling the answers failed: NotFound"})


def test_the_new_versions_answer_to_a_prompt_answered_twice_is_kept():
    state = smoke_round(expect_version="v2")
    record_answers(state, {"status": "success", "answers": {"a": answer("v2"), "b": answer("v1")}})
    assert not record_answers(state, {"status": "success", "answers": {"a": answer("v1")}})
    assert state.answers["a"]["model"] == "v2"
