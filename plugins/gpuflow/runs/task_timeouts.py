"""Each task's execution_timeout, derived from the configuration's own timeouts and what its operator waits for.

The timeouts inside a task (a Dataflow job's start, the export job, the build, the smoke test) end its wait
with the reason; the execution_timeout is Airflow's backstop above them, so that no task can hang forever.
Each operator class declares the wait it does (``execution_timeout_from``, a key of ``timeouts_s``), so a task's timeout
follows its operator, never its task id: a task renamed keeps its wait, and an operator that declares none
cannot be put in a DAG. It is set when the DAG file is parsed, from the DAG's configuration file (YAML, as the
trigger form reads it). A run that raises a timeout above what its task allows is refused by preflight
(``too_short_for``), with the fix: raise it in the configuration file.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

#: Time a task needs besides the waits the configuration bounds (clients, uploads, logs).
MARGIN_S = 15 * 60
#: Tasks that wait on nothing the configuration bounds.
SHORT_S = 15 * 60
SHORT = "short"
#: The least a task that waits on a job gets, so that a run that raises a wait above its file's, within the site's
#: limits.max_job_hours, fits the timeout set from the file at parse up to this floor (preflight refuses a longer one).
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
    """Seconds a task may run, by the wait its operator does, from the configuration keys ``get`` reads (dotted);
    with room for ``spare_fallbacks`` more fallback placements (and their regions) than the configuration names."""
    start = float(get("dataflow.start_timeout_s"))
    local_start = float(get("local.pipeline_start_timeout_s"))
    stop = float(get("dataflow.stop_timeout_s"))
    job_starts = _attempts(get, spare_fallbacks) * (max(start, local_start) + MARGIN_S)  # each placement in turn
    return {
        SHORT: SHORT_S,
        "export": float(get("export.timeout_s")) + MARGIN_S,
        "build": float(get("container.build_timeout_s")) + MARGIN_S,
        "job_start": job_starts,
        "smoke_test": max(float(get("smoke_test.timeout_s")), float(get("deployment.rollout_timeout_s")))
        + float(get("smoke_test.gpu_usage_timeout_s")) + MARGIN_S,
        "job_stop": stop + MARGIN_S,  # one job's drain or cancel (a replaced job, a deployment's)
        "every_region_stops": (_regions(get) + spare_fallbacks) * stop + MARGIN_S,  # a job in each region, in turn
        "input": float(get("batch.input_wait_s")) + MARGIN_S,
        "batch_job": job_starts + float(get("batch.job_timeout_s")),
        # a rollout's evaluation: two batch jobs (the serving version's, the candidate's), started at once and waited
        # for one after the other (the bound allows them in turn)
        "evaluation": 2 * (max(start, local_start) + MARGIN_S + float(get("batch.job_timeout_s"))),
        "publish": 2 * SHORT_S,  # counts every line again and copies the files within their bucket
        "gpu_usage": float(get("smoke_test.gpu_usage_timeout_s")) + MARGIN_S,
        "dataproc_batch": float(get("dataproc.timeout_s")) + MARGIN_S,
    }


def execution_timeout_from(task: Any) -> str:
    """The wait a task's operator declares; an operator without one is a mistake, said when the DAG is parsed."""
    wait = getattr(task, "execution_timeout_from", None)
    if wait is None:
        raise TypeError(f"{type(task).__name__} (task {task.task_id}) declares no execution_timeout_from: name the "
                        "wait it does, one of gpuflow.runs.task_timeouts.timeouts_s's keys")
    return str(wait)


def apply_task_timeouts(dag: Any) -> None:
    """Give every task of a gpuflow DAG its execution_timeout, from the configuration file of its form (attached
    first: ``gpuflow.runs.trigger_form.attach_trigger_form``)."""
    from gpuflow.runs.trigger_form import dag_form, form_values

    layout = dag_form(dag)
    if layout is None:
        raise TypeError(f"DAG {dag.dag_id} has no gpuflow form: call attach_trigger_form(dag, layout) first")
    values = form_values(layout)
    seconds = timeouts_s(values.__getitem__, spare_fallbacks=SPARE_FALLBACKS)
    for task in dag.tasks:
        wait = execution_timeout_from(task)
        needed = seconds[wait]
        task.execution_timeout = timedelta(seconds=needed if wait == SHORT else max(needed, WAITING_FLOOR_S))


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
    """What this run's configuration needs beyond its gpuflow tasks' execution_timeout, one line per task (a team's
    own tasks in the same DAG declare no wait, and are theirs to bound)."""
    needed = timeouts_s(config_lookup(config))
    return [f"{task.task_id} needs up to {needed[task.execution_timeout_from]:.0f}s but its execution_timeout is "
            f"{task.execution_timeout.total_seconds():.0f}s"
            for task in dag.tasks
            if getattr(task, "execution_timeout_from", None) is not None and task.execution_timeout is not None
            and needed[task.execution_timeout_from] > task.execution_timeout.total_seconds()]
