"""cleanup: stop the run's jobs, then delete the run's resources. Runs even when a step failed."""

from __future__ import annotations

import logging
from typing import Any

from gpuflow.config import GpuflowConfig
from gpuflow.naming import ResourceNames
from gpuflow.platform import JobHandle, Platform
from gpuflow.steps.resources import delete_resources

log = logging.getLogger(__name__)


def request_stops(names: ResourceNames, platform: Platform, handle: JobHandle | None) -> list[JobHandle]:
    """Ask every job of the run (by handle, and by the run's prefix) to stop; return those that were running."""
    handles = {h.id: h for h in platform.find_run_jobs(names)}
    if handle is not None:
        handles[handle.id] = handle
    stopping = [h for h in handles.values() if platform.request_stop(h)]
    log.info("asked %d job(s) of run %s to stop", len(stopping), names.prefix)
    return stopping


def delete_run_resources(config: GpuflowConfig, names: ResourceNames, platform: Platform,
                         stopped: list[str], pubsub: bool = True) -> dict[str, Any]:
    """Once the jobs have stopped: delete the run's topics and subscriptions (``pubsub``) and objects."""
    return {"stopped_jobs": stopped, **delete_resources(config, names, platform.conn_id, pubsub)}
