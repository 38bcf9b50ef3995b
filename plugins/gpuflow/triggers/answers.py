"""Wait in the triggerer until every smoke-test prompt has its answer or dead letter, or the deadline.

Not the provider's ``PubsubPullTrigger`` (apache-airflow-providers-google 22.8.0), though this pulls and
acknowledges with the provider's ``PubSubAsyncHook`` as that trigger does:
- it reads one subscription, and the smoke test waits on two: the answers and the dead letters. A prompt that
  only dead-letters would leave it waiting out its timeout, where the smoke test should fail at once with the
  reason;
- it ends at the first non-empty pull, so N answers that arrive in K pulls would cost K deferrals, each a round
  trip through the scheduler;
- it has no deadline of its own.

The messages are acknowledged here, so the event carries what they said (id, answer, model, batch size). A
triggerer that dies mid-wait loses the answers it acknowledged: the task's retry asks again.

The local profile's Pub/Sub is the emulator, which the triggerer's environment does not name
(``PUBSUB_EMULATOR_HOST`` is set only around a task's own work), so there the trigger talks to ``emulator_host``
over an insecure channel with the same generated client the provider's hook builds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import TriggerEvent

from gpuflow.triggers.settle import SETTLE_S, SettlingTrigger

#: The most messages one pull asks for (``maxMessages``: "a positive integer. The Pub/Sub system may return fewer
#: than the number specified", https://cloud.google.com/pubsub/reference/rest/v1/projects.subscriptions/pull).
#: Each pull sets ``returnImmediately``, which that page marks deprecated and discouraged, as the provider's
#: PubsubPullTrigger (22.8.0) still does by default: a pull that waited for messages on one subscription would
#: hold up the other's.
MAX_MESSAGES = 100


class _Subscriber:
    """Pull and acknowledge on one project's subscriptions: the provider's async hook, or the emulator."""

    def __init__(self, project: str, gcp_conn_id: str, emulator_host: str | None):
        self.project, self.gcp_conn_id, self.emulator_host = project, gcp_conn_id, emulator_host
        self._hook = self._client = None

    async def pull(self, subscription: str) -> list[Any]:
        if self.emulator_host is None:
            if self._hook is None:
                from airflow.providers.google.cloud.hooks.pubsub import PubSubAsyncHook

                self._hook = PubSubAsyncHook(gcp_conn_id=self.gcp_conn_id, project_id=self.project)
            received = await self._hook.pull(project_id=self.project, subscription=subscription,
                                             max_messages=MAX_MESSAGES, return_immediately=True)
            if received:
                await self._hook.acknowledge(project_id=self.project, subscription=subscription, messages=received)
            return list(received)
        client = self._emulator_client()
        path = client.subscription_path(self.project, subscription)
        response = await client.pull(request={"subscription": path, "max_messages": MAX_MESSAGES,
                                              "return_immediately": True})
        if response.received_messages:
            await client.acknowledge(request={"subscription": path,
                                              "ack_ids": [m.ack_id for m in response.received_messages]})
        return list(response.received_messages)

    def _emulator_client(self):
        if self._client is None:
            import grpc
            from google.auth.credentials import AnonymousCredentials
            from google.pubsub_v1.services.subscriber import SubscriberAsyncClient
            from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcAsyncIOTransport

            channel = grpc.aio.insecure_channel(self.emulator_host)
            self._client = SubscriberAsyncClient(transport=SubscriberGrpcAsyncIOTransport(
                channel=channel, credentials=AnonymousCredentials()))
        return self._client


class SmokeAnswersTrigger(SettlingTrigger):
    """Yields once: the ``answers`` and ``dead_letters`` (by prompt id) that came for any of ``ids`` (every prompt
    sent so far: a late answer to an earlier round counts, as a rollout's new version answers its backlog); status
    ``success`` once each of ``pending`` has one or the other, ``timeout`` at ``deadline`` (epoch seconds)."""

    def __init__(self, project: str, answers_subscription: str, dead_letter_subscription: str, ids: list[str],
                 pending: list[str], started: float, deadline: float, gcp_conn_id: str,
                 emulator_host: str | None = None, poll_interval_s: float = 0.5, settle_s: float = SETTLE_S):
        super().__init__(settle_s)
        self.project, self.ids, self.pending = project, list(ids), list(pending)
        self.answers_subscription, self.dead_letter_subscription = answers_subscription, dead_letter_subscription
        self.started, self.deadline, self.poll_interval_s = started, deadline, poll_interval_s
        self.gcp_conn_id, self.emulator_host = gcp_conn_id, emulator_host

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self._with_settle("gpuflow.triggers.answers.SmokeAnswersTrigger", {
            "project": self.project, "answers_subscription": self.answers_subscription,
            "dead_letter_subscription": self.dead_letter_subscription, "ids": self.ids, "pending": self.pending,
            "started": self.started,
            "deadline": self.deadline, "gcp_conn_id": self.gcp_conn_id, "emulator_host": self.emulator_host,
            "poll_interval_s": self.poll_interval_s})

    async def events(self) -> AsyncIterator[TriggerEvent]:
        subscriber = _Subscriber(self.project, self.gcp_conn_id, self.emulator_host)
        wanted, pending = set(self.ids), set(self.pending)
        answers: dict[str, dict[str, Any]] = {}
        dead_letters: dict[str, str] = {}
        last_progress = 0.0
        while True:
            try:
                for received in await subscriber.pull(self.answers_subscription):
                    attributes = dict(received.message.attributes)
                    if attributes.get("id") in wanted:
                        answers[attributes["id"]] = {
                            "answer": received.message.data.decode("utf-8", errors="replace"),
                            "latency_s": time.time() - self.started,
                            "batch_size": int(attributes.get("batch_size", 0)),
                            "model": attributes.get("model", "")}
                for received in await subscriber.pull(self.dead_letter_subscription):
                    attributes = dict(received.message.attributes)
                    if attributes.get("id") in wanted:
                        dead_letters[attributes["id"]] = attributes.get("error", "unknown")
            except Exception as error:  # a subscription deleted under the run, Pub/Sub refusing: the task says why
                yield TriggerEvent({"status": "error", "message": f"pulling the answers failed: {error}",
                                    "answers": answers, "dead_letters": dead_letters})
                return
            done = pending <= answers.keys() | dead_letters.keys()
            if done or time.time() >= self.deadline or time.monotonic() - last_progress > 5:
                self.log.info("answered %d/%d (dead letters: %d)", len(pending & answers.keys()), len(pending),
                              len(dead_letters))
                last_progress = time.monotonic()
            if done or time.time() >= self.deadline:
                yield TriggerEvent({"status": "success" if done else "timeout", "answers": answers,
                                    "dead_letters": dead_letters})
                return
            await asyncio.sleep(min(self.poll_interval_s, max(0.0, self.deadline - time.time())))


def smoke_answers_trigger(config: Any, names: Any, state: Any) -> SmokeAnswersTrigger:
    """The wait for the answers of ``state.sent`` not yet in, at the Pub/Sub this task published to: the
    emulator that the task's environment names (the local profile), or Google's."""
    import os

    waiting = [i for i in state.sent if i not in state.answers and i not in state.dead_letters]
    return SmokeAnswersTrigger(
        project=config.project, answers_subscription=names.responses_subscription,
        dead_letter_subscription=names.dead_letter_subscription, ids=list(state.sent), pending=waiting,
        started=state.window_start,
        deadline=state.deadline, gcp_conn_id=config.gcp_conn_id,
        emulator_host=os.environ.get("PUBSUB_EMULATOR_HOST") or None)
