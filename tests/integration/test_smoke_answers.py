"""The smoke test's wait for answers (gpuflow.triggers.answers), run as the triggerer runs it, on the real Pub/Sub
emulator: through the provider's async hook (the gcp profile), and straight at the emulator (the local profile)."""

import time
import uuid

import pytest

from gpuflow.triggers.answers import SmokeAnswersTrigger
from tests.helpers import GCP_TEST_PROJECT, first_event


@pytest.fixture
def subscriptions(gcp_env):
    """A fresh answers and dead-letter subscription; publish(kind, id, data, **attributes) puts a message there."""
    from airflow.providers.google.cloud.hooks.pubsub import PubSubHook

    hook, suffix = PubSubHook(gcp_conn_id="google_cloud_default"), uuid.uuid4().hex[:8]
    names = {}
    for kind in ("answers", "dead"):
        topic = f"smoke-{kind}-{suffix}"
        hook.create_topic(project_id=GCP_TEST_PROJECT, topic=topic)
        names[kind] = hook.create_subscription(project_id=GCP_TEST_PROJECT, topic=topic,
                                               subscription=f"{topic}-sub")

    def publish(kind, prompt_id, data=b"", **attributes):
        hook.publish(project_id=GCP_TEST_PROJECT, topic=f"smoke-{kind}-{suffix}",
                     messages=[{"data": data, "attributes": {"id": prompt_id, **attributes}}])

    return names, publish


def answers_trigger(names, ids, deadline_s, emulator_host, pending=None):
    now = time.time()
    return SmokeAnswersTrigger(project=GCP_TEST_PROJECT, answers_subscription=names["answers"],
                               dead_letter_subscription=names["dead"], ids=ids,
                               pending=ids if pending is None else pending, started=now,
                               deadline=now + deadline_s, gcp_conn_id="google_cloud_default",
                               emulator_host=emulator_host, poll_interval_s=0.05, settle_s=0)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", ["provider_hook", "emulator"])
def test_every_prompt_answered_or_dead_lettered_ends_the_wait_with_what_each_said(subscriptions, gcp_env, path):
    names, publish = subscriptions
    publish("answers", "p-1", b"Paris", model="v1", batch_size="2")
    publish("answers", "someone-else", b"not ours")
    publish("dead", "p-2", error="prompt too long")
    emulator = gcp_env["PUBSUB_EMULATOR_HOST"] if path == "emulator" else None
    event = first_event(answers_trigger(names, ["p-1", "p-2"], 30, emulator))
    assert event["status"] == "success"
    by_kind = {entry["kind"]: entry for entry in event["received"]}
    assert set(by_kind) == {"answer", "dead_letter"} and len(event["received"]) == 2
    answer, dead = by_kind["answer"], by_kind["dead_letter"]
    assert (answer["id"], answer["answer"], answer["model"], answer["batch_size"]) == ("p-1", "Paris", "v1", 2)
    assert (dead["id"], dead["error"]) == ("p-2", "prompt too long")
    assert answer["subscription"] == names["answers"].rsplit("/", 1)[-1] and len(answer["ack_ids"]) == 1


@pytest.mark.timeout(60)
def test_a_prompt_without_answer_ends_the_wait_at_the_deadline_with_what_came(subscriptions, gcp_env):
    names, publish = subscriptions
    publish("answers", "p-1", b"Paris")
    started = time.monotonic()
    event = first_event(answers_trigger(names, ["p-1", "p-never"], 1.5, None))
    assert event["status"] == "timeout" and [entry["id"] for entry in event["received"]] == ["p-1"]
    assert 1.4 < time.monotonic() - started < 20


@pytest.mark.timeout(60)
def test_a_late_answer_to_an_earlier_prompt_is_kept_while_the_wait_is_for_the_new_ones(subscriptions):
    """A rollout's new version answers its backlog: the answer to an earlier round's prompt still counts."""
    names, publish = subscriptions
    publish("answers", "round1-0", b"late", model="v2")
    publish("answers", "round2-0", b"now", model="v1")
    event = first_event(answers_trigger(names, ["round1-0", "round2-0"], 30, None, pending=["round2-0"]))
    assert event["status"] == "success"
    assert {entry["id"]: entry["model"] for entry in event["received"]} == {"round1-0": "v2", "round2-0": "v1"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", ["provider_hook", "emulator"])
def test_nothing_is_acknowledged_until_the_task_has_kept_it(subscriptions, gcp_env, path):
    """A trigger that died after pulling (its triggerer killed) lost nothing: the next one gets the same answers once
    their ack deadline has passed; once the task acknowledges what it kept, they are gone."""
    from gpuflow.configuration.loading import load_config
    from gpuflow.steps.smoke import SmokeRound, acknowledge, record_answers

    names, publish = subscriptions
    for number in range(3):
        publish("answers", f"p-{number}", b"yes", model="v1")
    emulator = gcp_env["PUBSUB_EMULATOR_HOST"] if path == "emulator" else None
    ids = ["p-0", "p-1", "p-2"]
    first = first_event(answers_trigger(names, ids, 30, emulator))  # its triggerer dies right after: no task saw it
    again = first_event(answers_trigger(names, ids, 40, emulator))  # the next triggerer's, after the ack deadline
    assert first["status"] == again["status"] == "success"
    assert sorted(e["id"] for e in again["received"]) == ids

    state = SmokeRound(window_start=time.time(), deadline=time.time() + 60, sent=dict.fromkeys(ids, "q"))
    acks = record_answers(state, again)  # the task keeps them, then acknowledges them
    acknowledge(load_config(None, overrides=[f"project={GCP_TEST_PROJECT}"]), "google_cloud_default", acks)
    assert sorted(state.answers) == ids
    after = first_event(answers_trigger(names, ids, 15, emulator))  # past one more ack deadline: nothing comes back
    assert after["status"] == "timeout" and after["received"] == []
