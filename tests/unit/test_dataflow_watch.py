"""What a Dataflow job's autoscaling events say about its start (``gpuflow.dataflow.watch``)."""

from types import SimpleNamespace

from google.cloud import dataflow_v1beta3

from gpuflow.dataflow.watch import DataflowStartWatch

RUNNING = dataflow_v1beta3.JobState.JOB_STATE_RUNNING


def event(seconds: int, workers: int):
    return SimpleNamespace(time=seconds, current_num_workers=workers)


def test_workers_have_started_when_any_event_saw_them_even_if_a_later_one_did_not():
    """A later change of the target (an event with 0 running workers) must not hide that workers came up."""
    watch = DataflowStartWatch("job-1", "running")
    outcome = watch.observe(RUNNING, [], [event(10, 1), event(20, 0)], elapsed_s=30)
    assert watch.workers_started and outcome is not None and outcome.status == "success"


def test_no_event_with_workers_is_still_waiting():
    watch = DataflowStartWatch("job-1", "running")
    assert watch.observe(RUNNING, [], [event(10, 0), event(20, 0)], elapsed_s=30) is None
    assert not watch.workers_started
