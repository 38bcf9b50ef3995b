"""Airflow's defer-exit race kept out (gpuflow.triggers.settle): a job done within the hold completes in execute,
without deferring; a longer one defers, its job still running; a start-up wait defers at once. The operators'
own wait_for, with a real local process and the real LocalProcessTrigger."""

import sys
import time
from pathlib import Path
from typing import Any

import pytest

try:
    from airflow.sdk.exceptions import TaskDeferred
except ImportError:  # Airflow 3.1, Composer's floor (test_triggers.py, which the floor runs, imports this module)
    from airflow.exceptions import TaskDeferred

from gpuflow.operators.base import JobWaitingOperator
from gpuflow.platform.emulators import process_alive, stop_process_group
from gpuflow.platform.processes import spawn_logged
from gpuflow.triggers import settle
from gpuflow.triggers.local import LocalProcessTrigger


class SleepOperator(JobWaitingOperator):
    """Starts ``sleep job_s`` and waits for it the way every gpuflow step does."""

    def __init__(self, *, job_s: float, log_path: Path, wait_first: bool = True, **kwargs: Any):
        super().__init__(task_id="sleep", deferrable=True, **kwargs)
        self.job_s, self.log_path, self.wait_first, self.pid = job_s, log_path, wait_first, 0

    def execute(self, context: Any) -> Any:
        self.pid = spawn_logged([sys.executable, "-c", f"import time; time.sleep({self.job_s})"], self.log_path)
        trigger = LocalProcessTrigger(pid=self.pid, log_path=str(self.log_path), until="done", timeout_s=60,
                                      poll_interval_s=0.05)
        return self.wait_for(context, trigger, 60, self.wait_first)

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> Any:
        return event


@pytest.fixture
def hold(monkeypatch):
    monkeypatch.setattr(settle, "HOLD_S", 2.0)
    return 2.0


def no_deferral(*args, **kwargs):
    raise AssertionError("deferred")


def test_a_job_done_within_the_hold_completes_in_execute_without_deferring(hold, tmp_path, monkeypatch):
    monkeypatch.setattr(SleepOperator, "defer", no_deferral)
    operator = SleepOperator(job_s=0.3, log_path=tmp_path / "job.log")
    started = time.monotonic()
    event = operator.execute({})
    assert event["status"] == "success" and str(operator.pid) in event["message"]
    assert time.monotonic() - started < hold  # as soon as the job ended, not at the hold's end


def test_a_job_that_outlasts_the_hold_defers_and_goes_on_running(hold, tmp_path):
    operator = SleepOperator(job_s=30, log_path=tmp_path / "job.log")
    started = time.monotonic()
    try:
        with pytest.raises(TaskDeferred) as deferred:
            operator.execute({})
        assert hold <= time.monotonic() - started < hold + 5
        assert deferred.value.method_name == "execute_complete" and deferred.value.trigger.pid == operator.pid
        assert process_alive(operator.pid)  # the worker's short wait ended; the job did not
    finally:
        stop_process_group(operator.pid, grace_s=1)


def test_a_wait_that_cannot_end_soon_defers_at_once(hold, tmp_path):
    operator = SleepOperator(job_s=0.3, log_path=tmp_path / "job.log", wait_first=False)
    started = time.monotonic()
    with pytest.raises(TaskDeferred):
        operator.execute({})
    assert time.monotonic() - started < hold


def test_no_hold_no_wait_in_the_worker(monkeypatch, tmp_path):
    """dag.test() runs (no scheduler, so no race) set the hold to 0: every wait defers as it did."""
    monkeypatch.setattr(settle, "HOLD_S", 0.0)
    with pytest.raises(TaskDeferred):
        SleepOperator(job_s=0.1, log_path=tmp_path / "job.log").execute({})
