"""The local profile's Pub/Sub reads, answered within seconds (Beam's DirectRunner only; Dataflow is untouched).

Beam 2.77's DirectRunner reads Pub/Sub with one synchronous pull that waits up to 30 s on an empty subscription
(``_PubSubReadEvaluator._read_from_pubsub`` in ``apache_beam/runners/direct/transform_evaluator.py``: ``pull(...,
timeout=30)``). It runs on one thread, so while it waits the batching timer of a burst's last prompts cannot fire:
the local demo's last answer came 31.8 s after its prompt. Here each of those pulls waits ``PULL_S`` at most: the
Pub/Sub emulator answers an empty pull about a second before its deadline (1.5 s for 2.5 s, measured here), and a
message that arrives meanwhile ends the pull at once (0.57 s for one published after 0.5 s). A deadline that passes
without an answer is an empty pull.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

#: The deadline of one DirectRunner pull: a shorter one returns at once from the emulator, and the runner spins.
PULL_S = 2.5


class _ShortPullClient:
    """A SubscriberClient whose pull waits ``PULL_S`` at most; everything else is the client's own."""

    def __init__(self, client):
        self._client = client

    def __getattr__(self, name):
        return getattr(self._client, name)

    def pull(self, *args, timeout=None, **kwargs):
        from google.api_core.exceptions import DeadlineExceeded
        from google.pubsub_v1 import PullResponse

        try:
            return self._client.pull(*args, timeout=min(timeout or PULL_S, PULL_S), **kwargs)
        except DeadlineExceeded:  # nothing arrived within PULL_S
            return PullResponse()


def shorten_direct_runner_pulls() -> None:
    """Make the DirectRunner's Pub/Sub reads wait ``PULL_S`` at most (the local profile's pipeline only)."""
    from apache_beam.runners.direct import transform_evaluator

    evaluator = transform_evaluator._PubSubReadEvaluator
    if getattr(evaluator, "_gpuflow_short_pull", False):
        return
    original = evaluator._get_subscriber_client.__func__

    def short_pull_client(cls, transform):
        return _ShortPullClient(original(cls, transform))

    evaluator._get_subscriber_client = classmethod(short_pull_client)
    evaluator._gpuflow_short_pull = True
    log.info("DirectRunner Pub/Sub pulls wait %.0f s at most on an empty subscription", PULL_S)
