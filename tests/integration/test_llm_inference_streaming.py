"""The streaming pipeline, launched as the DAG launches it, on the real Pub/Sub and GCS emulators."""

import re
import time

import pytest

from gpuflow.platform.local import LocalPlatform
from gpuflow.runs.naming import resource_names
from gpuflow.steps.cleanup import delete_run_resources, request_stops
from gpuflow.steps.launch import pipeline_argv
from gpuflow.steps.resources import create_resources, list_run_resources
from gpuflow.triggers import job_trigger
from tests.helpers import first_event, mixed_length_prompts

MAX_NEW_TOKENS = 8


def pull_all(pubsub, project: str, subscription: str, max_messages: int = 100) -> list[tuple[dict, bytes]]:
    """What the subscription holds now, acknowledged: (attributes, data) of each message."""
    received = pubsub.pull(subscription=subscription, max_messages=max_messages, project_id=project,
                           return_immediately=True)
    if received:
        pubsub.acknowledge(subscription=subscription, project_id=project, messages=received)
    return [(dict(r.message.attributes), r.message.data) for r in received]


@pytest.fixture
def architecture(request):
    """seq2seq unless a test is parametrized with another (indirect)."""
    return getattr(request, "param", "seq2seq")


@pytest.fixture
def streaming_run(local_config, emulators, architecture, request):
    config = local_config.model_copy(deep=True)
    config.model.max_new_tokens = MAX_NEW_TOKENS
    node = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")
    names = resource_names(config, f"gf-{node[-12:].strip('-')}")
    platform = LocalPlatform(config)
    create_resources(config, names, platform.conn_id)
    model_dir = request.getfixturevalue("demo_model_dir" if architecture == "seq2seq" else "demo_causal_model_dir")
    platform.export_model(str(model_dir), names)
    yield config, names, platform
    delete_run_resources(config, names, platform, [h.id for h in request_stops(names, platform, None)])
    assert list_run_resources(config, names, platform.conn_id) == {"topics": [], "subscriptions": [], "buckets": []}


def launch(config, names, platform):
    """As the launch task does: start the pipeline, then wait on the trigger it defers to."""
    handle = platform.launch_pipeline(pipeline_argv(config, names), names, "")
    event = first_event(job_trigger(config, handle, "running", platform.job_timeout_s("running")))
    assert event["status"] == "success", event
    return handle


def collect(config, names, platform, expected_ids, timeout_s=300):
    from airflow.providers.google.cloud.hooks.pubsub import PubSubHook

    pubsub = PubSubHook(gcp_conn_id=platform.conn_id)
    answers, dead_letters = {}, {}
    deadline = time.monotonic() + timeout_s
    while set(answers) | set(dead_letters) != expected_ids and time.monotonic() < deadline:
        for attributes, data in pull_all(pubsub, config.project, names.responses_subscription):
            answers[attributes["id"]] = (data.decode(), int(attributes["batch_size"]))
        for attributes, _ in pull_all(pubsub, config.project, names.dead_letter_subscription):
            dead_letters[attributes["id"]] = attributes["error"]
        time.sleep(0.5)
    return answers, dead_letters


def publish(platform, config, names, messages):
    from airflow.providers.google.cloud.hooks.pubsub import PubSubHook

    PubSubHook(gcp_conn_id=platform.conn_id).publish(topic=names.prompts_topic, project_id=config.project,
                                                     messages=messages)


@pytest.mark.parametrize("architecture", ["seq2seq", "causal"], indirect=True)
@pytest.mark.slow
def test_200_mixed_length_prompts_each_answered_as_generate_alone(streaming_run, architecture, request):
    reference_generate = request.getfixturevalue(
        "reference_generate" if architecture == "seq2seq" else "reference_generate_causal")
    config, names, platform = streaming_run
    with platform.environment():
        prompts = {f"p{i}": p for i, p in enumerate(mixed_length_prompts(reference_generate.tokenizer, 200))}
        # Published before the pipeline starts: the subscription created in setup keeps them.
        publish(platform, config, names, [{"data": p.encode(), "attributes": {"id": k}} for k, p in prompts.items()])
        handle = launch(config, names, platform)
        try:
            answers, dead_letters = collect(config, names, platform, set(prompts))
        finally:
            platform.stop_pipeline(handle)
    assert dead_letters == {}
    assert set(answers) == set(prompts), f"missing: {sorted(set(prompts) - set(answers))[:10]}"
    mismatched = [k for k, (answer, _) in answers.items() if answer != reference_generate(prompts[k], MAX_NEW_TOKENS)]
    assert mismatched == []
    batch_sizes = [size for _, size in answers.values()]
    assert max(batch_sizes) > 1, "prompts that arrived together were never batched across bundles"


def test_malformed_messages_go_to_dead_letters_and_good_ones_are_answered(streaming_run, reference_generate):
    config, names, platform = streaming_run
    good = {f"g{i}": f"what is the capital of country {i}" for i in range(6)}
    bad = {
        "bad-utf8": b"\xff\xfe not text",
        "empty": b"   ",
        "too-long": " ".join(["river"] * 600).encode(),
    }
    with platform.environment():
        handle = launch(config, names, platform)
        try:
            publish(platform, config, names,
                    [{"data": p.encode(), "attributes": {"id": k}} for k, p in good.items()]
                    + [{"data": data, "attributes": {"id": k}} for k, data in bad.items()])
            answers, dead_letters = collect(config, names, platform, set(good) | set(bad))
        finally:
            platform.stop_pipeline(handle)
    assert set(answers) == set(good)
    for key, (answer, _) in answers.items():
        assert answer == reference_generate(good[key], MAX_NEW_TOKENS)
    assert dead_letters["bad-utf8"].startswith("invalid UTF-8")
    assert dead_letters["empty"] == "empty prompt"
    assert "over the limit of 512" in dead_letters["too-long"]
