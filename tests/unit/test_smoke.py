"""The smoke test's bookkeeping between its deferrals: what the trigger pulled, rounds of a rollout, the verdict."""

import time

import pytest

from gpuflow.steps.smoke import (
    SmokeRound,
    SmokeTestFailed,
    another_round_due,
    failed_pull,
    record_answers,
    smoke_test_result,
)


def smoke_round(expect_version=None, deadline_s=60.0):
    now = time.time()
    return SmokeRound(window_start=now, deadline=now + deadline_s,
                      expect_version=expect_version, round_number=1, sent={"a": "hi", "b": "ho"})


def answer(model="v1"):
    return {"answer": "x", "latency_s": 1.0, "batch_size": 1, "model": model}


def pulled(*entries, status="success"):
    """A trigger's event: (prompt id, model or "dead: reason") in arrival order, each with its own ack id."""
    received = []
    for number, (prompt_id, what) in enumerate(entries):
        common = {"id": prompt_id, "ack_ids": {f"m{number}": f"ack-{number}"}}
        if what.startswith("dead: "):
            received.append({**common, "kind": "dead_letter", "subscription": "dead-sub", "model": "",
                             "error": what.removeprefix("dead: ")})
        else:
            received.append({**common, "kind": "answer", "subscription": "answers-sub", **answer(what)})
    return {"status": status, "received": received}


def take(state, event) -> bool:
    """As the task does: record, then whether another round is due."""
    record_answers(state, event)
    failed_pull(event)
    return another_round_due(state)


def test_every_answer_in_gives_the_rows_and_the_versions():
    state = smoke_round()
    assert take(state, pulled(("a", "v1"), ("b", "v1"))) is False
    result = smoke_test_result(state)
    assert (result["answered"], result["sent"], result["versions"]) == (2, 2, ["v1"])


def test_a_dead_letter_or_a_missing_answer_fails_with_both_named():
    state = smoke_round()
    take(state, pulled(("a", "dead: too long"), status="timeout"))
    with pytest.raises(SmokeTestFailed, match=r"0/2 prompts answered; dead letters: \{'a': 'too long'\}.*\['b'\]"):
        smoke_test_result(state)


def test_a_rollout_asks_again_until_the_new_version_answers():
    state = smoke_round(expect_version="v2")
    assert take(state, pulled(("a", "v1"), ("b", "v1")))
    state.sent.update({"c": "hi"})
    assert not take(state, pulled(("c", "v2")))
    assert smoke_test_result(state)["versions"] == ["v1", "v2"]


def test_a_rollout_out_of_time_stops_asking_and_says_the_new_version_never_answered():
    state = smoke_round(expect_version="v2", deadline_s=-1)
    assert not take(state, pulled(("a", "v1"), ("b", "v1")))
    with pytest.raises(SmokeTestFailed, match="never by the new version v2"):
        smoke_test_result(state)


def test_a_failed_pull_fails_with_the_fix():
    with pytest.raises(SmokeTestFailed, match="subscriptions exist"):
        take(smoke_round(), {"status": "error", "message": "pulling the answers failed: NotFound"})


@pytest.mark.parametrize("order", [("v2", "v1"), ("v1", "v2")], ids=["new-first", "old-after-new"])
def test_a_rollout_keeps_the_new_versions_answer_whatever_the_order_in_one_wait_or_across_waits(order):
    for events in ([pulled(("a", order[0]), ("b", "v1"), ("a", order[1]))],  # one wait
                   [pulled(("a", order[0]), ("b", "v1")), pulled(("a", order[1]))]):  # two
        state = smoke_round(expect_version="v2")
        for event in events:
            take(state, event)
        assert state.answers["a"]["model"] == "v2" and state.answers["b"]["model"] == "v1"


def test_outside_a_rollout_the_first_answer_stays_and_every_ack_id_is_handed_back():
    state = smoke_round()
    acks = record_answers(state, pulled(("a", "v1"), ("a", "v9"), ("b", "dead: empty")))
    assert state.answers["a"]["model"] == "v1" and state.dead_letters == {"b": "empty"}
    assert acks == {"answers-sub": ["ack-0", "ack-1"], "dead-sub": ["ack-2"]}
