"""cleanup: stop the run's pipeline, then delete the run's resources. Runs even when a step failed."""

from __future__ import annotations

import logging
from typing import Any

from gpuflow.config import GpuflowConfig
from gpuflow.naming import ResourceNames
from gpuflow.platform import JobHandle, Platform
from gpuflow.steps.resources import delete_resources

log = logging.getLogger(__name__)


def cleanup(config: GpuflowConfig, names: ResourceNames, platform: Platform,
            handle: JobHandle | None) -> dict[str, Any]:
    handles = {h.id: h for h in platform.find_run_jobs(names)}
    if handle is not None:
        handles[handle.id] = handle
    stopped = [h.id for h in handles.values() if platform.stop_pipeline(h)]
    log.info("stopped %d pipeline(s) of run %s", len(stopped), names.prefix)
    deleted = delete_resources(config, names, platform.conn_id)
    return {"stopped_jobs": stopped, **deleted}
