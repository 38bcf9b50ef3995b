"""A persistent deployment's rollout: plan it, roll the new version or job out, promote it or roll it back, and
tear the deployment down. (The paths and their reasons: ``gpuflow.runs.rollout``.)"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

from gpuflow.configuration.model import ConfigError, GpuflowConfig
from gpuflow.platform import JobBackend, JobHandle
from gpuflow.platform.records import Records
from gpuflow.runs.naming import (
    DEPLOYMENT_LABEL,
    ResourceNames,
    deployment_folder,
    deployment_prefix,
    owned_by_deployment,
)
from gpuflow.runs.rollout import DeploymentRecord, RolloutPlan, job_options, owner_problem, plan_rollout

log = logging.getLogger(__name__)


def expected_image(config: GpuflowConfig, names: ResourceNames) -> str:
    """The image build_container will name: the configured one, or the rendered recipe's content tag."""
    from gpuflow.steps.container import image_for, render_context

    if config.container.image:
        return config.container.image
    with tempfile.TemporaryDirectory(prefix="gpuflow-plan-") as work_dir:
        return image_for(config, render_context(config, names, Path(work_dir)))


def plan(config: GpuflowConfig, names: ResourceNames, platform: JobBackend) -> RolloutPlan:
    """Which path this run takes, from the deployment's record and whether its job still runs."""
    record = Records(config, platform.conn_id).read(names.serving)
    problem = owner_problem(record, config, "roll out onto")
    if problem:
        raise ConfigError(problem)
    running = record is not None and platform.job_running(JobHandle.model_validate(record.job))
    rollout = plan_rollout(config, record, expected_image(config, names), running)
    log.info("deployment %s: %s. %s", names.deployment, rollout.path, rollout.why)
    return rollout


def roll_out_weights(config: GpuflowConfig, names: ResourceNames, platform: JobBackend,
                     rollout: RolloutPlan) -> JobHandle:
    """The weights path: point the running job at the run's new version; its handle is the recorded job's."""
    Records(config, platform.conn_id).write_pointer(names.serving, names.model_version, names.model_dir_uri,
                                                    names.state_dict_uri)
    return JobHandle.model_validate(rollout.served.job)


def ensure_version_pointer(config: GpuflowConfig, names: ResourceNames, platform: JobBackend,
                           record: DeploymentRecord | None) -> str | None:
    """Before a deployment's job starts, its pointer folder must hold a pointer: Beam 2.77's WatchFilePattern
    "expects at least one file present that matches the file_pattern" at startup, and on an empty folder its side
    input never fires, so RunInference would hold every prompt (apache_beam/ml/inference/utils.py).

    A new deployment: the launch version's pointer. A deployment whose job serves (update, replace): the folder
    keeps its pointers, and where it has none, the recorded version's, the one that job already serves: a pointer
    to the new version would switch the serving job before the smoke test has passed. Either way the new job starts
    on its own ``--model-version``; Beam hands it only pointers written after it started."""
    records = Records(config, platform.conn_id)
    if record is None:
        return records.write_pointer(names.serving, names.model_version, names.model_dir_uri,
                                     names.state_dict_uri)
    if records.has_pointer(names.serving):
        return None
    return records.write_pointer(names.serving, record.model_version, record.model_dir_uri, record.state_dict_uri)


def update_in_place(config: GpuflowConfig, names: ResourceNames, platform: JobBackend, image: str,
                    rollout: RolloutPlan) -> JobHandle:
    """The update path: Dataflow replaces the recorded job in place, under its name."""
    from gpuflow.steps.launch import pipeline_argv

    return platform.update_pipeline(pipeline_argv(config, names), names, image, rollout.served.job_name,
                                    config.deployment.transform_name_mapping)


def promote(config: GpuflowConfig, names: ResourceNames, platform: JobBackend, rollout: RolloutPlan,
            handle: JobHandle, image: str, run_id: str, evaluation: dict[str, Any] | None = None) -> JobHandle | None:
    """The new version answered: record it as the deployment's state. On the replace path, ask the old job to drain
    (so that what it holds is answered) and return it, for the task to wait until it has stopped."""
    record = DeploymentRecord(
        name=names.serving, job=handle.to_xcom(), job_name=handle.name,
        subscription=rollout.served.subscription if rollout.path == "weights" else names.prompts_subscription,
        image=image, model_version=names.model_version, model_dir_uri=names.model_dir_uri,
        state_dict_uri=names.state_dict_uri, options=job_options(config), changed_by=run_id, url=handle.url,
        config_file=config.source_file or "", evaluation=evaluation)
    Records(config, platform.conn_id).write(record, expected=rollout.record)
    if rollout.path != "replace" or rollout.record is None:
        return None
    old = JobHandle.model_validate(rollout.record.job)
    if old.id == handle.id:
        return None
    if platform.request_stop(old, drain=True):
        log.info("draining the replaced job %s (%s): it answers what it holds, then stops", old.name, old.id)
        return old
    return None


def after_replaced_job(config: GpuflowConfig, names: ResourceNames, platform: JobBackend,
                       rollout: RolloutPlan) -> list[str]:
    """Once the replaced job has stopped: its own subscription goes, if it had one (the local profile), after its
    backlog is handed to the topic, where the new job's subscription gets it."""
    old_subscription = rollout.record.subscription if rollout.record and rollout.path == "replace" else None
    if not old_subscription or old_subscription == names.prompts_subscription:
        return []
    hand_over_backlog(config, platform.conn_id, old_subscription, names.prompts_topic)
    from gpuflow.steps.resources import delete_subscriptions

    delete_subscriptions(config, platform.conn_id, [old_subscription])
    return [old_subscription]


#: The attribute a handed-over prompt carries: its copy in the old subscription is then only acknowledged.
HANDED_OVER = "gpuflow_handed_over"


def hand_over_backlog(config: GpuflowConfig, conn_id: str, subscription: str, topic: str) -> int:
    """Republish what a subscription still holds to its topic (same data and attributes), acknowledging each only
    once it is republished. The republished copy reaches this subscription too (it is still on the topic): marked,
    it is only acknowledged there, so the loop ends."""
    from airflow.providers.google.cloud.hooks.pubsub import PubSubHook

    pubsub, moved = PubSubHook(**config.hook_identity(conn_id)), 0
    while received := pubsub.pull(subscription=subscription, max_messages=100, project_id=config.project,
                                  return_immediately=True):
        originals = [r for r in received if HANDED_OVER not in r.message.attributes]
        if originals:
            pubsub.publish(topic=topic, project_id=config.project, messages=[
                {"data": r.message.data, "attributes": {**r.message.attributes, HANDED_OVER: subscription}}
                for r in originals])
        pubsub.acknowledge(subscription=subscription, project_id=config.project, messages=received)
        moved += len(originals)
    if moved:
        log.info("handed %d prompts left in %s back to %s", moved, subscription, topic)
    return moved


def roll_back(config: GpuflowConfig, names: ResourceNames, platform: JobBackend, rollout: RolloutPlan,
              pushed: JobHandle | None, run_id: str) -> dict[str, Any]:
    """The run did not promote its version: what serves stays as recorded. Weights: point the job back at the
    recorded version (the new one may have loaded). A new job (replace, new) is stopped by cleanup as one of the
    run's jobs; an update in place is undone by updating again with the recorded image and options."""
    records = Records(config, platform.conn_id)
    current = records.read(names.serving)
    if current is not None and current.changed_by == run_id:
        return {"rolled_back": False, "serving": current.model_version}  # promoted
    record = rollout.record
    if record is None:
        log.warning("deployment %s: its first version did not take over; nothing was recorded", names.deployment)
        return {"rolled_back": True, "serving": None}
    if pushed is None:  # the run stopped before its launch: nothing serving was touched
        pass
    elif rollout.path == "weights":
        records.write_pointer(names.serving, record.model_version, record.model_dir_uri, record.state_dict_uri)
    elif rollout.path == "update" and current is not None and rolled_back_update(current, record):
        log.info("deployment %s: the update was already undone (job %s serves the recorded version)",
                 names.deployment, current.job.get("id"))  # a retry of cleanup: no second update
    elif rollout.path == "update":
        from gpuflow.steps.launch import pipeline_argv

        restored = restored_config(config, record)
        old_names = names.model_copy(update={"model_dir_uri": record.model_dir_uri,
                                             "model_version": record.model_version})
        handle = platform.update_pipeline(pipeline_argv(restored, old_names), old_names, record.image,
                                          record.job_name, config.deployment.transform_name_mapping)
        records.write(record.model_copy(update={"job": handle.to_xcom(), "url": handle.url}), expected=record)
    log.warning("deployment %s rolled back: version %s keeps serving on job %s", names.deployment,
                record.model_version, record.job_name)
    return {"rolled_back": True, "serving": record.model_version}


def rolled_back_update(current: DeploymentRecord, planned: DeploymentRecord) -> bool:
    """The record an update's rollback writes: what the plan read, on the restoring update's job."""
    moved = {"job", "url"}
    return current.job != planned.job and current.model_dump(exclude=moved) == planned.model_dump(exclude=moved)


def restored_config(config: GpuflowConfig, record: DeploymentRecord) -> GpuflowConfig:
    """The configuration with the recorded job's options put back (an update's rollback)."""
    from gpuflow.configuration.loading import load_config

    dumped = config.model_dump(mode="json")
    for key, value in record.options.items():
        node = dumped
        *parents, last = key.split(".")
        for part in parents:
            node = node[part]
        node[last] = value
    return load_config(None, dumped)


def deployment_resources(config: GpuflowConfig, conn_id: str, name: str) -> dict[str, list[str]]:
    """The deployment's own topics and subscriptions that exist now: exactly its names (``owned_by_deployment``),
    each labelled ``gpuflow-deployment=<name>``. A name proves nothing: deployment ``prod``'s prefix is also the
    start of ``prod-eu``'s names, and any team may name a topic ``gfd-…``."""
    from gpuflow.steps.resources import list_labeled

    found = list_labeled(config, conn_id, deployment_prefix(name) + "-")
    return {kind: [item for item, labels in items.items()
                   if owned_by_deployment(config, name, kind, item) and labels.get(DEPLOYMENT_LABEL) == name]
            for kind, items in found.items()}


def tear_down(config: GpuflowConfig, platform: JobBackend, name: str, stopped: list[str]) -> dict[str, Any]:
    """Once the deployment's job has stopped: its subscriptions, topics, model folder and record go."""
    from gpuflow.steps.resources import delete_objects, delete_subscriptions, delete_topics

    found = deployment_resources(config, platform.conn_id, name)
    delete_subscriptions(config, platform.conn_id, found["subscriptions"])
    delete_topics(config, platform.conn_id, found["topics"])
    objects = delete_objects(config, platform.conn_id, deployment_folder(config, name) + "/") if config.bucket else 0
    Records(config, platform.conn_id).delete(name)
    log.info("deployment %s torn down: jobs %s, subscriptions %s, topics %s, %d objects, record", name,
             stopped or "none running", found["subscriptions"], found["topics"], objects)
    return {"deployment": name, "stopped_jobs": stopped, **found, "deleted_objects": objects}
