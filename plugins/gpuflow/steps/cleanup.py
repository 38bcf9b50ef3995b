"""cleanup: stop the run's jobs, then delete the run's resources. Runs even when a step failed."""

from __future__ import annotations

import logging
from typing import Any

from gpuflow.configuration.model import GpuflowConfig
from gpuflow.platform import JobFinder, JobHandle
from gpuflow.runs.naming import ResourceNames
from gpuflow.runs.rollout import DeploymentRecord
from gpuflow.steps.resources import delete_resources

log = logging.getLogger(__name__)


def request_stops(names: ResourceNames, platform: JobFinder, handle: JobHandle | None,
                  keep: str | None = None) -> list[JobHandle]:
    """Ask every job of the run (by handle, and by the run's prefix) to stop, except ``keep`` (the job id a
    deployment serves on); return those that were running."""
    handles = {h.id: h for h in platform.find_run_jobs(names)}
    if handle is not None:
        handles[handle.id] = handle
    if keep is not None:
        handles.pop(keep, None)
    stopping = [h for h in handles.values() if platform.request_stop(h)]
    log.info("asked %d job(s) of run %s to stop", len(stopping), names.prefix)
    return stopping


def delete_run_resources(config: GpuflowConfig, names: ResourceNames, platform: JobFinder,
                         stopped: list[str], pubsub: bool = True, serving: DeploymentRecord | None = None
                         ) -> dict[str, Any]:
    """Once the jobs have stopped: delete the run's topics and subscriptions (``pubsub``) and objects. A
    deployment's run (``serving``: its record now) also deletes the job subscription and the model version it made,
    unless they now serve."""
    extra: tuple[str, ...] = ()
    if names.deployment:
        if names.owns_job_subscription and (serving is None or names.prompts_subscription != serving.subscription):
            extra = (names.prompts_subscription,)
        if serving is None or serving.model_dir_uri != names.model_dir_uri:
            from gpuflow.steps.resources import delete_objects

            delete_objects(config, platform.conn_id, names.model_dir_uri + "/")
    return {"stopped_jobs": stopped, **delete_resources(config, names, platform.conn_id, pubsub, extra)}
