"""quick_deferrals: tasks whose jobs end just after the task defers, the moment Airflow's defer-exit race needs
(``gpuflow.triggers.settle``). Each task waits as every gpuflow task does (``JobWaitingOperator.wait_for``):
up to ``HOLD_S`` in its worker, then deferred to a ``LocalProcessTrigger``; its job ends ``job_s`` (the run's conf)
after that. For tests/integration/test_airflow_live.py and benchmarks/defer_race.py; not one of gpuflow's DAGs (it lives
outside dags/, a DAG bundle of its own)."""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.sdk import DAG

from gpuflow.operators.base import JobWaitingOperator

#: Deferrals per run.
TASKS = 4


class QuickJobOperator(JobWaitingOperator):
    """Starts a ``sleep`` that outlasts the worker's short wait by ``job_s``, and waits for it."""

    def execute(self, context: Any) -> Any:
        import os
        from pathlib import Path

        from gpuflow.platform.processes import spawn_logged
        from gpuflow.triggers.local import LocalProcessTrigger
        from gpuflow.triggers.settle import HOLD_S

        job_s = float(context["dag_run"].conf.get("job_s", 0.5))
        folder = Path(os.environ["AIRFLOW_HOME"]) / "quick-deferrals"
        folder.mkdir(exist_ok=True)
        log_path = folder / f"{context['run_id']}-{self.task_id}.log".replace(":", "_").replace("+", "_")
        pid = spawn_logged(["sleep", str(HOLD_S + job_s)], log_path)
        return self.wait_for(context, LocalProcessTrigger(pid=pid, log_path=str(log_path), until="done",
                                                          timeout_s=600, poll_interval_s=0.1), 600)

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> Any:
        from gpuflow.operators.airflow_names import AirflowException
        from gpuflow.operators.base import event_succeeded

        if not event_succeeded(event):
            raise AirflowException(f"the job did not end well: {event}")
        return event["message"]  # type: ignore[index]


with DAG(dag_id="quick_deferrals", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
         catchup=False, max_active_runs=4, default_args={"retries": 1, "retry_delay": pendulum.duration(seconds=5)}):
    for number in range(TASKS):
        QuickJobOperator(task_id=f"quick_{number}", deferrable=True, execution_timeout=pendulum.duration(minutes=15))
