"""smoke_test: ask the running pipeline questions and wait until every one has its answer."""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from pydantic import BaseModel

from gpuflow.configuration.model import GpuflowConfig
from gpuflow.runs.naming import ResourceNames

log = logging.getLogger(__name__)

SAMPLE_PROMPTS = [
    "What is the capital of France?",
    "Translate to German: the river runs fast",
    "Explain why a GPU runs inference fast",
    "List three colors",
    "How many workers does the pipeline run?",
    "Summarize: the cat sat by the river in the city",
    "Which country has Berlin as its capital?",
    "Describe a green mountain",
]


class SmokeTestFailed(RuntimeError):
    pass


def smoke_prompts(count: int) -> list[str]:
    return [SAMPLE_PROMPTS[i % len(SAMPLE_PROMPTS)] for i in range(count)]


def format_answers_table(rows: list[dict[str, Any]], width: int = 48) -> str:
    def cut(text: str) -> str:
        return text if len(text) <= width else text[: width - 1] + "…"

    lines = [f"{'PROMPT':<{width}}  {'ANSWER':<{width}}  LATENCY"]
    lines += [f"{cut(r['prompt']):<{width}}  {cut(r['answer']):<{width}}  {r['latency_s']:.1f}s" for r in rows]
    return "\n".join(lines)


class NoGpuUsage(RuntimeError):
    pass


def format_gpu_usage(usage: dict[str, Any]) -> str:
    if "max_utilization" not in usage or usage.get("source") == "nvidia-smi" and not usage.get("gpus"):
        return f"GPU usage ({usage.get('source')}): {usage.get('note', 'no readings')}"
    if usage["source"] == "nvidia-smi":
        return "GPU usage (nvidia-smi): " + ", ".join(
            f"{g['name']} {g['utilization']:.0%} busy, memory {g['memory_utilization']:.0%}" for g in usage["gpus"])
    return (f"GPU usage (Cloud Monitoring, job {usage['job_id']}, {usage['samples']} samples): utilisation max "
            f"{usage['max_utilization']:.0%}, mean {usage['mean_utilization']:.0%}; memory utilisation max "
            f"{usage['max_memory_utilization']:.0%} (the share of time device memory was read or written, not how "
            "full it is)")


def check_gpu_usage(config: GpuflowConfig, usage: dict[str, Any]) -> None:
    """The guide's "no GPU usage": answers came back, but the GPU did not work for them."""
    log.info("%s", format_gpu_usage(usage))
    if not config.uses_gpu:
        return
    judged = config.traits.gpu_usage_judged
    if not judged or config.smoke_test.gpu_usage == "ignore" or "max_utilization" not in usage:
        if judged and "note" in usage:
            log.warning("%s; the GPU check was not possible", usage["note"])
        return
    if usage["max_utilization"] > 0:
        return
    message = (f"the job's GPUs stayed at 0% utilisation while it answered the smoke test ({usage['samples']} "
               "samples): inference ran on the CPU. Fix: set require_gpu: true so a worker without a GPU fails, "
               "check worker_accelerator (install-nvidia-driver) and that the image has a CUDA build of torch.")
    if config.smoke_test.gpu_usage == "fail":
        raise NoGpuUsage(message)
    log.warning("%s", message)


class SmokeRound(BaseModel):
    """The smoke test's state between its deferrals (it crosses them in XCom): what was sent, what came back."""

    window_start: float  # epoch seconds: when the pipeline began to work on the prompts (the GPU-usage window)
    deadline: float  # epoch seconds
    expect_version: str | None = None
    round_number: int = 0
    sent: dict[str, str] = {}  # prompt id -> prompt
    answers: dict[str, dict[str, Any]] = {}
    dead_letters: dict[str, str] = {}

    @property
    def timeout_s(self) -> float:
        return self.deadline - self.window_start


def start_smoke_test(config: GpuflowConfig, names: ResourceNames, conn_id: str,
                     expect_version: str | None = None) -> SmokeRound:
    """Publish the first round of prompts, with ids. The task then defers until each has its answer or dead letter
    (``gpuflow.triggers.answers``), for up to smoke_test.timeout_s.

    ``expect_version`` (a deployment's rollout): the wait goes on until answers come from that model version,
    publishing the prompts again each round, for up to deployment.rollout_timeout_s; the old version answering what
    it got is fine, a dead letter is not."""
    timeout_s = config.deployment.rollout_timeout_s if expect_version else config.smoke_test.timeout_s
    now = time.time()
    state = SmokeRound(window_start=now, deadline=now + timeout_s, expect_version=expect_version)
    publish_round(config, names, conn_id, state)
    return state


def publish_round(config: GpuflowConfig, names: ResourceNames, conn_id: str, state: SmokeRound) -> None:
    from airflow.providers.google.cloud.hooks.pubsub import PubSubHook

    state.round_number += 1
    batch = uuid.uuid4().hex[:8]
    this_round = {f"smoke-{batch}-{i}": prompt for i, prompt in enumerate(smoke_prompts(config.smoke_test.num_prompts))}
    state.sent.update(this_round)
    PubSubHook(**config.hook_identity(conn_id)).publish(topic=names.prompts_topic, project_id=config.project, messages=[
        {"data": prompt.encode(), "attributes": {"id": prompt_id}} for prompt_id, prompt in this_round.items()])
    log.info("published %d prompts to %s%s", len(this_round), names.prompts_topic,
             f" (round {state.round_number}, waiting for version {state.expect_version})"
             if state.expect_version else "")


def keep_answer(known: dict[str, Any] | None, new: dict[str, Any], expect_version: str | None) -> dict[str, Any]:
    """The one rule for a prompt answered twice (a replacement job overlapping the old one, a redelivered answer):
    in a rollout, the new version's answer, whichever came first; otherwise the first that came."""
    if known is None:
        return new
    if expect_version and new["model"] == expect_version and known["model"] != expect_version:
        return new
    return known


def record_answers(state: SmokeRound, event: dict[str, Any]) -> dict[str, list[str]]:
    """Take in, in arrival order, what the trigger pulled; returns the ack ids of all of it by subscription, for
    the task to acknowledge once ``state`` is kept (nothing was acknowledged before)."""
    acks: dict[str, list[str]] = {}
    for entry in event.get("received") or []:
        prompt_id = entry["id"]
        if entry["kind"] == "dead_letter":
            state.dead_letters.setdefault(prompt_id, entry["error"])
        else:
            answer = {key: entry[key] for key in ("answer", "latency_s", "batch_size", "model")}
            state.answers[prompt_id] = keep_answer(state.answers.get(prompt_id), answer, state.expect_version)
        acks.setdefault(entry["subscription"], []).extend(entry["ack_ids"].values())
    return acks


def acknowledge(config: GpuflowConfig, conn_id: str, acks: dict[str, list[str]]) -> None:
    """Acknowledge what the task has kept. An ack id that expired meanwhile only means Pub/Sub resends that
    message; the next wait of this task sees it as already answered."""
    from airflow.providers.google.cloud.hooks.pubsub import PubSubHook

    hook = PubSubHook(**config.hook_identity(conn_id))
    for subscription, ack_ids in acks.items():
        try:
            hook.acknowledge(subscription=subscription, project_id=config.project, ack_ids=ack_ids)
        except Exception as error:  # kept already: a failed ack costs a redelivery, never an answer
            log.warning("acknowledging %d message(s) on %s failed (%s): Pub/Sub will resend them", len(ack_ids),
                        subscription, error)


def failed_pull(event: dict[str, Any]) -> None:
    if event.get("status") == "error":
        raise SmokeTestFailed(f"{event.get('message')}. Fix: check that the run's subscriptions exist "
                              "(the setup task creates them) and that the connection may consume them.")


def another_round_due(state: SmokeRound) -> bool:
    """A rollout whose new version has not answered yet, with time left and no dead letter."""
    from_expected = [a for a in state.answers.values() if a["model"] == state.expect_version]
    return bool(state.expect_version and not from_expected and not state.dead_letters
                and time.time() < state.deadline)


def smoke_test_result(state: SmokeRound) -> dict[str, Any]:
    """Every prompt answered (by the expected version, in a rollout), or an error that says what is missing."""
    answers, sent, timeout_s = state.answers, state.sent, state.timeout_s
    rows = [{"id": prompt_id, "prompt": prompt, **answers[prompt_id]} for prompt_id, prompt in sent.items()
            if prompt_id in answers]
    if rows:
        log.info("smoke test answers:\n%s", format_answers_table(rows))
    missing = [prompt_id for prompt_id in sent if prompt_id not in answers and prompt_id not in state.dead_letters]
    if state.dead_letters or missing:
        raise SmokeTestFailed(
            f"{len(answers)}/{len(sent)} prompts answered; dead letters: {state.dead_letters or 'none'}; "
            f"no answer within {timeout_s:.0f}s for: {missing or 'none'}. "
            "Fix: read the pipeline log (launch task) and raise smoke_test.timeout_s if the model is slow to load."
        )
    versions = sorted({a["model"] for a in answers.values()})
    if state.expect_version and state.expect_version not in versions:
        raise SmokeTestFailed(
            f"every prompt was answered, but only by model version(s) {versions}, never by the new version "
            f"{state.expect_version} within {timeout_s:.0f}s ({state.round_number} rounds): the new version did "
            "not take over (the job's log says why, e.g. 'model version ... failed to load'). The deployment is "
            "rolled back.")
    return {"answered": len(answers), "sent": len(sent), "answers": rows, "versions": versions,
            "window": [state.window_start, time.time()]}
