"""Each task's execution_timeout, derived from the configuration's own timeouts.

The timeouts inside a task (a Dataflow job's start, the export job, the build, the smoke test) end its wait
with the reason; the execution_timeout is Airflow's backstop above them, so that no task can hang forever.
It is set when the DAG file is parsed, from the DAG's configuration file (YAML, as the trigger form reads it).
A run that raises a timeout above what its task allows is refused by preflight (``too_short_for``), with the
fix: raise it in the configuration file.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

#: Time a task needs besides the waits the configuration bounds (clients, uploads, logs).
MARGIN_S = 15 * 60
#: Tasks that wait on nothing the configuration bounds.
SHORT_S = 15 * 60
SHORT_TASKS = frozenset({"preflight", "check_quota", "setup", "report"})
#: The least a task that waits on a job gets, so that a run naming another configuration file with longer
#: waits than the DAG's (configs/gcp.example.yaml: a 20-minute smoke test) still fits.
WAITING_FLOOR_S = 60 * 60
#: Fallback placements a run may add in its form beyond the file's, and still fit the launch's timeout.
SPARE_FALLBACKS = 2

Lookup = Callable[[str], Any]


def _attempts(get: Lookup, spare: int) -> int:
    """The first placement and each fallback (plus ``spare`` more): a launch may start that many jobs in turn."""
    return 1 + len(get("gpu.fallbacks") or []) + spare


def _regions(get: Lookup) -> int:
    return len({get("region"), *((f or {}).get("region") for f in get("gpu.fallbacks") or [])} - {None})


def timeouts_s(get: Lookup, spare_fallbacks: int = 0) -> dict[str, float]:
    """Seconds each task may run, by task id, from the configuration keys ``get`` reads (dotted); with room for
    ``spare_fallbacks`` more fallback placements (and their regions) than the configuration names."""
    start = float(get("dataflow.start_timeout_s"))
    local_start = float(get("local.pipeline_start_timeout_s"))
    stop = float(get("dataflow.stop_timeout_s"))
    every_region_stops = (_regions(get) + spare_fallbacks) * stop + MARGIN_S  # a job in each region, one by one
    return {
        # llm_streaming_inference
        "preflight": SHORT_S,
        "check_quota": SHORT_S,
        "setup": SHORT_S,
        "export_model": float(get("export.timeout_s")) + MARGIN_S,
        "build_container": float(get("container.build_timeout_s")) + MARGIN_S,
        "verify_gpu": _attempts(get, spare_fallbacks) * (max(start, local_start) + MARGIN_S),
        "launch": _attempts(get, spare_fallbacks) * (max(start, local_start) + MARGIN_S),
        "smoke_test": max(float(get("smoke_test.timeout_s")), float(get("deployment.rollout_timeout_s")))
        + float(get("smoke_test.gpu_usage_timeout_s")) + MARGIN_S,
        "promote": stop + MARGIN_S,  # the replaced job's drain
        "cleanup": every_region_stops,
        # llm_streaming_teardown and gpuflow_janitor: their jobs' stops
        "teardown": stop + MARGIN_S,
        "janitor": every_region_stops,
        # llm_batch_inference (besides the tasks named above): the input's wait, the job's start and its run
        "wait_for_input": float(get("batch.input_wait_s")) + MARGIN_S,
        "run_batch": _attempts(get, spare_fallbacks) * (max(start, local_start) + MARGIN_S)
        + float(get("batch.job_timeout_s")),
        "publish": 2 * SHORT_S,  # counts every line again and copies the files within their bucket
        "check_gpu_usage": float(get("smoke_test.gpu_usage_timeout_s")) + MARGIN_S,
        # gpu_quota_report
        "report": SHORT_S,
        # dataproc_gpu_batch
        "batch": float(get("dataproc.timeout_s")) + MARGIN_S,
    }


def apply_task_timeouts(dag: Any) -> None:
    """Give every task of a gpuflow DAG its execution_timeout, from the DAG's configuration file."""
    from gpuflow.trigger_form import form_values

    values = form_values(dag.dag_id)
    seconds = timeouts_s(values.__getitem__, spare_fallbacks=SPARE_FALLBACKS)
    for task in dag.tasks:
        needed = seconds.get(task.task_id, SHORT_S)
        waits = task.task_id in seconds and task.task_id not in SHORT_TASKS
        task.execution_timeout = timedelta(seconds=max(needed, WAITING_FLOOR_S) if waits else needed)


def config_lookup(config: Any) -> Lookup:
    """``timeouts_s``'s reader over a validated GpuflowConfig (a config without a batch has no batch wait)."""

    def get(dotted: str) -> Any:
        value: Any = config
        for part in dotted.split("."):
            value = getattr(value, part, None) if value is not None else None
        if dotted == "gpu.fallbacks":
            return [fallback.model_dump() for fallback in value]
        return 0 if value is None and dotted.startswith("dataproc.") else value

    return get


def too_short_for(config: Any, dag: Any) -> list[str]:
    """What this run's configuration needs beyond its tasks' execution_timeout, one line per task."""
    needed = timeouts_s(config_lookup(config))
    return [f"{task.task_id} needs up to {needed[task.task_id]:.0f}s but its execution_timeout is "
            f"{task.execution_timeout.total_seconds():.0f}s"
            for task in dag.tasks
            if task.task_id in needed and task.execution_timeout is not None
            and needed[task.task_id] > task.execution_timeout.total_seconds()]
