"""Wait in the triggerer until every smoke-test prompt has its answer or dead letter, or the deadline.

Not the provider's ``PubsubPullTrigger`` (apache-airflow-providers-google 22.8.0), though this pulls and
acknowledges with the provider's ``PubSubAsyncHook`` as that trigger does:
- it reads one subscription, and the smoke test waits on two: the answers and the dead letters. A prompt that
  only dead-letters would leave it waiting out its timeout, where the smoke test should fail at once with the
  reason;
- it ends at the first non-empty pull, so N answers that arrive in K pulls would cost K deferrals, each a round
  trip through the scheduler;
- it has no deadline of its own.

Nothing the task wants is acknowledged here. The event hands the task every answer and dead letter, in arrival
order, with the ack ids that acknowledge it; the task keeps them (its XCom) and only then acknowledges them
(``gpuflow.steps.smoke``). A triggerer that dies mid-wait therefore loses nothing: Pub/Sub resends what was pulled
and not acknowledged once its ack deadline passes ("the approximate amount of time Pub/Sub waits for the subscriber
to acknowledge receipt before resending the message", Subscription.ack_deadline_seconds in google-cloud-pubsub's
pubsub_v1 types), and the smoke test's subscriptions have the shortest one, 10 s
(``steps.resources.ANSWERS_ACK_DEADLINE_S``), so the next triggerer's trigger sees it again within seconds.
While one trigger holds them, the same messages come back to it every 10 s: it keeps each once (by message id) with
its newest ack id. Messages for no prompt of this run are acknowledged at once.

The local profile's Pub/Sub is the emulator, which the triggerer's environment does not name
(``PUBSUB_EMULATOR_HOST`` is set only around a task's own work), so there the trigger talks to ``emulator_host``
over an insecure channel with the same generated client the provider's hook builds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import TriggerEvent

from gpuflow.triggers.settle import HOLD_S, SettlingTrigger

if TYPE_CHECKING:
    from airflow.providers.google.cloud.hooks.pubsub import PubSubAsyncHook
    from google.pubsub_v1.services.subscriber import SubscriberAsyncClient

#: The most messages one pull asks for (``maxMessages``: "a positive integer. The Pub/Sub system may return fewer
#: than the number specified", https://cloud.google.com/pubsub/reference/rest/v1/projects.subscriptions/pull).
#: Each pull sets ``returnImmediately``, which that page marks deprecated and discouraged, as the provider's
#: PubsubPullTrigger (22.8.0) still does by default: a pull that waited for messages on one subscription would
#: hold up the other's.
MAX_MESSAGES = 100


class _Subscriber:
    """Pull and acknowledge on one project's subscriptions: the provider's async hook, or the emulator."""

    def __init__(self, project: str, gcp_conn_id: str, emulator_host: str | None,
                 impersonation_chain: list[str] | None = None):
        self.project, self.gcp_conn_id, self.emulator_host = project, gcp_conn_id, emulator_host
        self.impersonation_chain = impersonation_chain
        self._hook: PubSubAsyncHook | None = None
        self._client: SubscriberAsyncClient | None = None

    async def pull(self, subscription: str) -> list[Any]:
        """What the subscription has, unacknowledged: each comes back after its ack deadline until acknowledged."""
        if self.emulator_host is None:
            received = await self._provider_hook().pull(project_id=self.project, subscription=subscription,
                                                        max_messages=MAX_MESSAGES, return_immediately=True)
            return list(received)
        client = self._emulator_client()
        response = await client.pull(request={"subscription": client.subscription_path(self.project, subscription),
                                              "max_messages": MAX_MESSAGES, "return_immediately": True})
        return list(response.received_messages)

    async def acknowledge(self, subscription: str, ack_ids: list[str]) -> None:
        if self.emulator_host is None:
            await self._provider_hook().acknowledge(project_id=self.project, subscription=subscription,
                                                    ack_ids=ack_ids)
            return
        client = self._emulator_client()
        await client.acknowledge(request={"subscription": client.subscription_path(self.project, subscription),
                                          "ack_ids": ack_ids})

    def _provider_hook(self) -> PubSubAsyncHook:
        if self._hook is None:
            from airflow.providers.google.cloud.hooks.pubsub import PubSubAsyncHook

            self._hook = PubSubAsyncHook(gcp_conn_id=self.gcp_conn_id, impersonation_chain=self.impersonation_chain,
                                         project_id=self.project)
        return self._hook

    def _emulator_client(self) -> SubscriberAsyncClient:
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
    """Yields once: ``received``, every answer and dead letter that came for any of ``ids`` (every prompt sent so
    far: a late answer to an earlier round counts, as a rollout's new version answers its backlog), in arrival
    order, each with its subscription and ack ids, none acknowledged; status ``success`` once each of ``pending``
    has one or the other, ``timeout`` at ``deadline`` (epoch seconds)."""

    def __init__(self, project: str, answers_subscription: str, dead_letter_subscription: str, ids: list[str],
                 pending: list[str], started: float, deadline: float, gcp_conn_id: str,
                 impersonation_chain: list[str] | None = None, emulator_host: str | None = None,
                 poll_interval_s: float = 0.5, settle_s: float = HOLD_S,
                 carried: dict[str, Any] | None = None, deferred_at: float | None = None):
        super().__init__(settle_s, carried, deferred_at)
        self.project, self.ids, self.pending = project, list(ids), list(pending)
        self.answers_subscription, self.dead_letter_subscription = answers_subscription, dead_letter_subscription
        self.started, self.deadline, self.poll_interval_s = started, deadline, poll_interval_s
        self.gcp_conn_id, self.impersonation_chain, self.emulator_host = gcp_conn_id, impersonation_chain, emulator_host

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self._with_settle("gpuflow.triggers.answers.SmokeAnswersTrigger", {
            "project": self.project, "answers_subscription": self.answers_subscription,
            "dead_letter_subscription": self.dead_letter_subscription, "ids": self.ids, "pending": self.pending,
            "started": self.started,
            "deadline": self.deadline, "gcp_conn_id": self.gcp_conn_id, "impersonation_chain": self.impersonation_chain,
            "emulator_host": self.emulator_host,
            "poll_interval_s": self.poll_interval_s})

    def _entry(self, kind: str, subscription: str, received: Any) -> dict[str, Any]:
        attributes = dict(received.message.attributes)
        entry = {"id": attributes["id"], "kind": kind, "subscription": subscription,
                 "model": attributes.get("model", ""), "ack_ids": {received.message.message_id: received.ack_id}}
        if kind == "answer":
            entry.update(answer=received.message.data.decode("utf-8", errors="replace"),
                         latency_s=time.time() - self.started, batch_size=int(attributes.get("batch_size", 0)))
        else:
            entry["error"] = attributes.get("error", "unknown")
        return entry

    async def events(self) -> AsyncIterator[TriggerEvent]:
        subscriber = _Subscriber(self.project, self.gcp_conn_id, self.emulator_host, self.impersonation_chain)
        wanted, pending = set(self.ids), set(self.pending)
        # (prompt id, kind, model version) -> what came, in arrival order; a duplicate's ack ids join the first's
        received: dict[tuple[str, str, str], dict[str, Any]] = {}
        last_progress = 0.0
        while True:
            try:
                for kind, subscription in (("answer", self.answers_subscription),
                                           ("dead_letter", self.dead_letter_subscription)):
                    strangers = []
                    for message in await subscriber.pull(subscription):
                        attributes = message.message.attributes
                        if attributes.get("id") not in wanted:
                            strangers.append(message.ack_id)
                            continue
                        key = (attributes["id"], kind, attributes.get("model", ""))
                        if key in received:  # a redelivery (its newest ack id), or the pipeline's duplicate
                            received[key]["ack_ids"][message.message.message_id] = message.ack_id
                        else:
                            received[key] = self._entry(kind, subscription, message)
                    if strangers:
                        await subscriber.acknowledge(subscription, strangers)
            except Exception as error:  # a subscription deleted under the run, Pub/Sub refusing: the task says why
                yield TriggerEvent({"status": "error", "message": f"pulling the answers failed: {error}",
                                    "received": list(received.values())})
                return
            answered = {entry["id"] for entry in received.values()}
            done = pending <= answered
            if done or time.time() >= self.deadline or time.monotonic() - last_progress > 5:
                self.log.info("answered %d/%d (dead letters: %d)", len(pending & answered), len(pending),
                              sum(entry["kind"] == "dead_letter" for entry in received.values()))
                last_progress = time.monotonic()
            if done or time.time() >= self.deadline:
                # Held for settle_s at most before the task gets it: nothing in it is acknowledged yet, so a
                # triggerer that dies meanwhile loses nothing.
                yield TriggerEvent({"status": "success" if done else "timeout", "received": list(received.values())})
                return
            await asyncio.sleep(min(self.poll_interval_s, max(0.0, self.deadline - time.time())))


def smoke_answers_trigger(config: Any, names: Any, state: Any,
                          carried: dict[str, Any] | None = None) -> SmokeAnswersTrigger:
    """The wait for the answers of ``state.sent`` not yet in, at the Pub/Sub this task published to: the
    emulator that the task's environment names (the local profile), or Google's. Its event echoes ``carried``."""
    import os

    waiting = [i for i in state.sent if i not in state.answers and i not in state.dead_letters]
    return SmokeAnswersTrigger(
        project=config.project, answers_subscription=names.responses_subscription,
        dead_letter_subscription=names.dead_letter_subscription, ids=list(state.sent), pending=waiting,
        started=state.window_start,
        deadline=state.deadline, **config.hook_identity(),
        emulator_host=os.environ.get("PUBSUB_EMULATOR_HOST") or None, carried=carried)
