"""The local pipeline's Pub/Sub pulls (beam_jobs/direct_runner_pull.py) on the real Pub/Sub emulator."""

import threading
import time

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def subscription(emulators):
    from google.cloud import pubsub

    publisher, subscriber = pubsub.PublisherClient(), pubsub.SubscriberClient()
    suffix = f"{time.monotonic_ns():x}"
    topic = publisher.topic_path("gpuflow-local", f"pull-{suffix}")
    name = subscriber.subscription_path("gpuflow-local", f"pull-{suffix}-sub")
    publisher.create_topic(name=topic)
    subscriber.create_subscription(name=name, topic=topic)
    yield publisher, topic, subscriber, name
    subscriber.delete_subscription(subscription=name)
    publisher.delete_topic(topic=topic)


def test_an_empty_pull_ends_within_its_short_deadline_and_a_message_ends_it_at_once(subscription):
    from direct_runner_pull import PULL_S, _ShortPullClient

    publisher, topic, subscriber, name = subscription
    client = _ShortPullClient(subscriber)
    started = time.monotonic()
    empty = client.pull(subscription=name, max_messages=10, timeout=30)  # what Beam's DirectRunner asks
    assert list(empty.received_messages) == [] and time.monotonic() - started < PULL_S + 2  # not Beam's 30 s
    threading.Timer(0.3, lambda: publisher.publish(topic, b"late prompt").result()).start()
    deadline = time.monotonic() + 10
    received = []
    while not received and time.monotonic() < deadline:
        received = list(client.pull(subscription=name, max_messages=10, timeout=30).received_messages)
    assert [m.message.data for m in received] == [b"late prompt"]


def test_only_the_direct_runners_reads_are_shortened():
    from apache_beam.runners.direct import transform_evaluator
    from direct_runner_pull import _ShortPullClient, shorten_direct_runner_pulls

    evaluator = transform_evaluator._PubSubReadEvaluator
    shorten_direct_runner_pulls()
    shorten_direct_runner_pulls()  # once only: no wrapper around a wrapper
    client = evaluator._get_subscriber_client(type("Transform", (), {})())
    assert isinstance(client, _ShortPullClient) and not isinstance(client._client, _ShortPullClient)
