"""gpuflow's triggers, run as the triggerer runs them (their async run() and on_kill()), with Google's services
faked under the provider's async hooks and the local profile's processes real."""

import asyncio
import contextlib
import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest
from google.cloud import aiplatform_v1, dataflow_v1beta3
from google.cloud.devtools import cloudbuild_v1

from gpuflow.configuration.loading import load_config
from gpuflow.platform import JobHandle
from gpuflow.platform.emulators import process_alive
from gpuflow.platform.processes import PIPELINE_RUNNING_MARKER, is_gpuflow_process, spawn_logged
from gpuflow.triggers import job_trigger
from tests.gcp_fakes import (
    BATCH_SUCCEEDS,
    EXHAUSTED,
    LAUNCH_FAILS,
    STREAMING_STARTS,
    STREAMING_STARTS_BY_AUTOSCALING,
    ZONE_EXHAUSTED,
    FakeCloudBuild,
    FakeGoogleCloud,
    FakeVertex,
    Importance,
    JobState,
    gcp_test_config,
)
from tests.helpers import GCP_TEST_PROJECT, first_event


@pytest.fixture
def cloud(monkeypatch, gcp_connection):
    """The fakes under the provider's hooks."""
    return FakeGoogleCloud().install(monkeypatch)


def dataflow_trigger(cloud, script, until="running", timeout_s=5.0):
    handle = cloud.dataflow.scripted_job(script)
    return handle, job_trigger(gcp_test_config(), handle, until, timeout_s)


# -- Dataflow: workers started, done, stopped, or the reason it will not ----------------------------------------


def test_a_streaming_job_is_running_once_its_workers_have_started(cloud):
    handle, trigger = dataflow_trigger(cloud, STREAMING_STARTS)
    event = first_event(trigger)
    assert event["status"] == "success" and "workers have started" in event["message"]
    polled = cloud.dataflow.calls("get_job")
    assert len(polled) == len(STREAMING_STARTS)  # RUNNING alone was not enough: it waited for the workers
    assert all(r.job_id == handle.id and r.project_id == GCP_TEST_PROJECT and r.location == "us-central1"
               for r in polled)


def test_a_streaming_launch_that_dataflow_runs_as_a_batch_job_fails_with_the_fix(cloud):
    """The fake answers from the request: a job staged without --streaming is a batch job, whatever its name."""
    handle = cloud.dataflow.scripted_job(STREAMING_STARTS, streaming=False)
    event = first_event(job_trigger(gcp_test_config(), handle, "running", 5.0))
    assert event["status"] == "failed" and "runs as a batch job" in event["message"] and "--streaming" in event["message"]


def test_start_messages_are_read_at_detailed_importance(cloud):
    """Dataflow may write "Workers have started successfully." at DETAILED: asking for BASIC would miss it."""
    first_event(dataflow_trigger(cloud, STREAMING_STARTS)[1])
    requests = cloud.dataflow.calls("list_job_messages")
    assert requests and all(Importance(r.minimum_importance) == Importance.JOB_MESSAGE_DETAILED for r in requests)


def test_workers_seen_only_in_autoscaling_events_count_as_started(cloud):
    assert first_event(dataflow_trigger(cloud, STREAMING_STARTS_BY_AUTOSCALING)[1])["status"] == "success"
    assert len(cloud.dataflow.calls("get_job")) == len(STREAMING_STARTS_BY_AUTOSCALING)  # 0 workers was not enough


def test_a_worker_pool_message_that_is_no_dataflow_wording_does_not_count(cloud):
    script = [(JobState.JOB_STATE_RUNNING, [(Importance.JOB_MESSAGE_BASIC, "Worker pool started.")])]
    event = first_event(dataflow_trigger(cloud, script, timeout_s=0.05)[1])
    assert event["status"] == "timeout" and "no worker activity has been seen" in event["message"]


def test_a_failed_job_ends_the_wait_with_dataflows_message_and_the_fix(cloud):
    event = first_event(dataflow_trigger(cloud, LAUNCH_FAILS)[1])
    assert event["status"] == "failed"
    assert "JOB_STATE_FAILED" in event["message"] and "unknown opcode" in event["message"]
    assert "different Python minor versions" in event["message"]


def test_an_exhausted_zone_ends_the_wait_at_once_even_while_the_job_says_running(cloud):
    event = first_event(dataflow_trigger(cloud, ZONE_EXHAUSTED)[1])
    assert event["status"] == "failed" and EXHAUSTED in event["message"] and "gpu.fallbacks" in event["message"]


def test_region_wide_exhaustion_wording_ends_the_wait_too(cloud):
    region_wide = ("Startup of the worker pool in us-central1 failed to bring up any of the desired 1 workers. "
                   "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS: Instance 'x' creation failed.")
    script = [(JobState.JOB_STATE_RUNNING, [(Importance.JOB_MESSAGE_ERROR, region_wide)])]
    event = first_event(dataflow_trigger(cloud, script)[1])
    assert event["status"] == "failed" and "gpu.fallbacks" in event["message"]


def test_workers_that_never_start_time_out_with_the_guides_advice(cloud):
    event = first_event(dataflow_trigger(cloud, [(JobState.JOB_STATE_RUNNING, [])], timeout_s=0.05)[1])
    assert event["status"] == "timeout"
    assert "no worker activity has been seen" in event["message"] and "disk_size_gb" in event["message"]


def test_a_batch_job_is_waited_for_until_done(cloud):
    event = first_event(dataflow_trigger(cloud, BATCH_SUCCEEDS, until="done")[1])
    assert event["status"] == "success" and len(cloud.dataflow.calls("get_job")) == len(BATCH_SUCCEEDS)


def test_a_stopping_job_is_waited_for_until_it_has_stopped(cloud):
    script = [(JobState.JOB_STATE_CANCELLING, []), (JobState.JOB_STATE_CANCELLING, []),
              (JobState.JOB_STATE_CANCELLED, [])]
    event = first_event(dataflow_trigger(cloud, script, until="stopped")[1])
    assert event["status"] == "success" and "JOB_STATE_CANCELLED" in event["message"]
    assert cloud.dataflow.calls("list_job_messages") == []  # a stop needs the state only


def test_api_errors_are_retried_then_end_the_wait(cloud):
    handle, trigger = dataflow_trigger(cloud, STREAMING_STARTS)
    del cloud.dataflow.jobs[handle.id]  # every get_job now answers NotFound
    event = first_event(trigger)
    assert event["status"] == "error" and "not found" in event["message"]
    assert len(cloud.dataflow.calls("get_job")) == 3


def test_on_kill_cancels_the_dataflow_job(cloud):
    handle, trigger = dataflow_trigger(cloud, STREAMING_STARTS)
    asyncio.run(trigger.on_kill())
    (update,) = cloud.dataflow.calls("update_job")
    assert (update.job_id, update.location, update.project_id) == (handle.id, "us-central1", GCP_TEST_PROJECT)
    assert JobState(update.job.requested_state) == dataflow_v1beta3.JobState.JOB_STATE_CANCELLED


# -- Vertex AI and Cloud Build: the provider's triggers, with on_kill and a timeout ---------------------------------


def vertex_handle():
    name = f"projects/{GCP_TEST_PROJECT}/locations/us-central1/customJobs/4411"
    return JobHandle(kind="vertex-custom-job", id="4411", name=name, location="us-central1")


def test_the_export_trigger_is_the_providers_custom_job_trigger(cloud):
    """The provider's where it has one (22.8.0), gpuflow's copy at Composer's floor (22.2.2, make test-composer)."""
    from airflow.providers.google.cloud.triggers import vertex_ai

    from gpuflow.triggers.vertex_custom_job import CustomJobTrigger as Copy

    CustomJobTrigger = getattr(vertex_ai, "CustomJobTrigger", Copy)
    trigger = job_trigger(gcp_test_config(), vertex_handle(), "done", 30)
    assert isinstance(trigger, CustomJobTrigger)
    event = first_event(trigger)
    assert event["status"] == "success" and event["custom_job"]["name"].endswith("/customJobs/4411")
    polls = [r for n, r in cloud.vertex.requests if n == "get_custom_job"]
    assert all(isinstance(r, aiplatform_v1.GetCustomJobRequest) for r in polls) and len(polls) == 2


def test_an_export_that_outlasts_its_timeout_is_cancelled(cloud):
    cloud.vertex = FakeVertex(running_polls=10**6)
    event = first_event(job_trigger(gcp_test_config(), vertex_handle(), "done", 0.5))
    assert event["status"] == "error" and "did not finish within 0s and was cancelled" in event["message"]
    ((_, cancel),) = [r for r in cloud.vertex.requests if r[0] == "cancel_custom_job"]
    assert cancel.name == vertex_handle().name


def test_a_workers_short_wait_on_the_providers_trigger_ends_without_cancelling_the_job(cloud):
    """The task's wait in its worker before deferring (gpuflow.triggers.settle) runs the provider trigger's own
    wait (``events``): an export done in time gives its event; one still running is left to run when the short
    wait ends, for the deferred trigger to wait on."""
    from gpuflow.triggers import event_in_worker

    assert event_in_worker(job_trigger(gcp_test_config(), vertex_handle(), "done", 30), 30)["status"] == "success"
    cloud.vertex = FakeVertex(running_polls=10**6)
    with pytest.raises(TimeoutError):
        event_in_worker(job_trigger(gcp_test_config(), vertex_handle(), "done", 30), 0.5)
    assert not [r for r in cloud.vertex.requests if r[0] == "cancel_custom_job"]


def test_a_failed_build_ends_with_cloud_builds_detail_and_a_killed_one_is_cancelled(cloud):
    detail = 'Build step 0 "gcr.io/cloud-builders/docker" failed: step exited with non-zero status: 1'
    cloud.build = FakeCloudBuild(cloud.registry, fail_with=detail)
    cloud.build.create_build(cloudbuild_v1.CreateBuildRequest(build=cloudbuild_v1.Build(images=["img:tag"])))
    handle = JobHandle(kind="cloud-build", id="b7e1c0de", name="b7e1c0de", location="us-central1")
    trigger = job_trigger(gcp_test_config("dataflow.poll_interval_s=0.01"), handle, "done", 30)
    assert first_event(trigger) == {"status": "error", "message": detail}
    asyncio.run(trigger.on_kill())
    ((_, cancel),) = [r for r in cloud.build.requests if r[0] == "cancel_build"]
    assert (cancel.id, cancel.project_id) == ("b7e1c0de", GCP_TEST_PROJECT)


# -- the local profile's processes -----------------------------------------------------------------------------


def start_process(tmp_path, body: str) -> JobHandle:
    """A process whose command line names llm_inference.py (so on_kill may stop it), logging to a file."""
    script = tmp_path / "llm_inference.py"
    script.write_text(textwrap.dedent(body))
    log_path = tmp_path / "pipeline.log"
    pid = spawn_logged([sys.executable, str(script)], log_path)
    return JobHandle(kind="local-process", id=str(pid), name="pipeline", location=str(log_path)), ChildProcess(pid)


class ChildProcess:
    """What the tests ask of a process that spawn_logged started (it is this process's child)."""

    def __init__(self, pid: int):
        self.pid = pid

    def poll(self):
        return None if process_alive(self.pid) else 0

    def wait(self, timeout: float = 30):
        with contextlib.suppress(ChildProcessError):  # already reaped by subprocess's own clean-up
            os.waitpid(self.pid, 0)

    def kill(self):
        os.killpg(self.pid, signal.SIGKILL)


def test_a_just_started_process_is_known_as_gpuflows_at_once(tmp_path):
    """A task killed right after its launch must stop the job: the kernel shows an exec'ing process's arguments
    only a moment after Popen returns, and spawn_logged waits for them (CI once left a pipeline running)."""
    for attempt in range(50):
        pid = spawn_logged(["/bin/sh", "-c", "sleep 30", "llm_inference.py"], tmp_path / f"sleep-{attempt}.log")
        try:
            assert is_gpuflow_process(pid), f"attempt {attempt}: {Path(f'/proc/{pid}/cmdline').read_bytes()!r}"
        finally:
            ChildProcess(pid).kill()
            ChildProcess(pid).wait()


def test_a_local_pipeline_is_running_once_it_logs_so(tmp_path):
    handle, process = start_process(tmp_path, f"""
        import time
        time.sleep(0.3)
        print({PIPELINE_RUNNING_MARKER!r}, flush=True)
        time.sleep(60)
    """)
    try:
        event = first_event(job_trigger(load_config(None), handle, "running", 30))
        assert event["status"] == "success" and process.poll() is None
    finally:
        process.kill()


def test_a_local_pipeline_that_exits_fails_with_its_log_tail(tmp_path):
    handle, process = start_process(tmp_path, "raise SystemExit('ModuleNotFoundError: no module named torch')")
    process.wait()
    event = first_event(job_trigger(load_config(None), handle, "running", 30))
    assert event["status"] == "failed" and "no module named torch" in event["message"]


def test_a_local_job_is_done_when_its_process_has_finished(tmp_path):
    handle, process = start_process(tmp_path, "import time; time.sleep(0.3)")
    assert first_event(job_trigger(load_config(None), handle, "done", 30))["status"] == "success"


def test_a_local_batch_job_that_fails_is_not_done_and_says_why(tmp_path):
    handle, process = start_process(tmp_path, "raise SystemExit('ValueError: bad glob')")
    event = first_event(job_trigger(load_config(None), handle, "done", 30))
    assert event["status"] == "failed" and "exit status 1" in event["message"] and "bad glob" in event["message"]


def test_on_kill_stops_the_local_process(tmp_path):
    handle, process = start_process(tmp_path, "import time; time.sleep(60)")
    asyncio.run(job_trigger(load_config(None), handle, "running", 30).on_kill())
    process.wait(timeout=15)
    assert not process_alive(process.pid)


def test_an_early_event_is_held_for_the_settle_time_and_a_late_one_is_not(tmp_path):
    """Airflow 3.3.2 fails a task whose trigger fires before the scheduler has seen the deferring process exit
    (apache/airflow#67287): gpuflow's triggers hold an early event for settle_s, and only an early one."""
    from gpuflow.triggers.local import LocalProcessTrigger

    handle, process = start_process(tmp_path, "pass")
    process.wait()
    for settle_s, at_least in ((0.8, 0.8), (0.0, 0.0)):
        trigger = LocalProcessTrigger(pid=int(handle.id), log_path=handle.location, until="done", timeout_s=30,
                                      settle_s=settle_s)
        started = time.monotonic()
        assert first_event(trigger)["status"] == "success"
        assert at_least <= time.monotonic() - started < at_least + 0.7
    ended_at = tmp_path / "ended_at"  # CLOCK_MONOTONIC is one clock for every process of the machine
    slow, process = start_process(tmp_path, f"import time; time.sleep(1.5); open({str(ended_at)!r}, 'w').write("
                                            "str(time.monotonic()))")
    event = first_event(LocalProcessTrigger(pid=int(slow.id), log_path=slow.location, until="done", timeout_s=30,
                                            poll_interval_s=0.1, settle_s=0.8))
    # No settle added to a long wait: the event comes a poll after the process ended, not settle_s after it.
    assert event["status"] == "success" and time.monotonic() - float(ended_at.read_text()) < 0.8


# -- a kill while deferred, on a triggerer that does not call on_kill (Airflow 3.1, Composer's floor) ---------------


def cancel_while_waiting(trigger, task_states: dict[str, str], monkeypatch, cancels: int = 1,
                         answer_delay_s: float = 0.0) -> list[dict]:
    """Run ``trigger`` as the triggerer does, then cancel its asyncio task as the 3.1 triggerer does for a user's
    action and for its own shutdown alike (``cancels`` times, 0.1 s apart: it cancels again at each of its loops until
    the task has ended); Airflow's answer to "what state is the task in" is ``task_states``, ``answer_delay_s``
    late, at the boundary the triggerer's supervisor serves (``RuntimeTaskInstance.get_task_states``). The event loop
    lives on until what the cancel started has ended, as the triggerer's does. Returns the questions."""
    import time
    from types import SimpleNamespace

    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    from gpuflow.triggers import kill

    asked: list[dict] = []

    def get_task_states(**query):
        asked.append(query)
        time.sleep(answer_delay_s)
        return {query["run_ids"][0]: {task_id: state for task_id, state in task_states.items()
                                      if task_id in query["task_ids"]}}

    monkeypatch.setattr(RuntimeTaskInstance, "get_task_states", staticmethod(get_task_states))
    monkeypatch.setattr(kill, "TRIGGERER_CALLS_ON_KILL", False)
    trigger.task_instance = SimpleNamespace(dag_id="llm_streaming_inference", task_id="launch", run_id="manual__1",
                                            map_index=-1)

    async def run_then_cancel():
        async def wait():
            async for _ in trigger.run():
                raise AssertionError("the trigger fired before it was cancelled")

        task = asyncio.create_task(wait())
        await asyncio.sleep(0.5)
        for _ in range(cancels):
            task.cancel()
            await asyncio.sleep(0.1)
        with pytest.raises(asyncio.CancelledError):
            await task
        others = [other for other in asyncio.all_tasks() if other is not asyncio.current_task()]
        if others:
            await asyncio.wait(others, timeout=20)

    asyncio.run(run_then_cancel())
    return asked


def test_the_version_says_which_triggerer_calls_on_kill():
    """Airflow 3.3's triggerer calls on_kill for a user's action (TriggerRunner.run_trigger); 3.1's never does, so
    gpuflow's triggers call it themselves there, and only there (never twice)."""
    from airflow import __version__
    from airflow.jobs import triggerer_job_runner

    from gpuflow.triggers.kill import TRIGGERER_CALLS_ON_KILL

    assert hasattr(triggerer_job_runner, "_USER_ACTION_CANCEL_MSG") == TRIGGERER_CALLS_ON_KILL, __version__


@pytest.mark.parametrize(("state", "stopped"), [("failed", True), ("success", True), ("deferred", False)])
def test_a_cancelled_local_wait_stops_the_process_only_if_the_task_left_deferral(tmp_path, monkeypatch, state,
                                                                                 stopped):
    handle, process = start_process(tmp_path, "import time; time.sleep(60)")
    try:
        asked = cancel_while_waiting(job_trigger(load_config(None), handle, "running", 30), {"launch": state},
                                     monkeypatch)
        assert asked == [{"dag_id": "llm_streaming_inference", "task_ids": ["launch"], "run_ids": ["manual__1"],
                          "map_index": -1}]
        if stopped:
            process.wait(timeout=15)
        assert process_alive(process.pid) is not stopped
    finally:
        if process_alive(process.pid):
            process.kill()


def test_cancels_that_come_again_do_not_cut_the_kill_short(tmp_path, monkeypatch):
    """The 3.1 triggerer cancels a trigger again at each of its loops until the trigger's task has ended: the question
    to Airflow and the stop still finish (shielded), so the killed task's process is stopped (seen live on 3.1.8)."""
    handle, process = start_process(tmp_path, "import time; time.sleep(600)")
    try:
        cancel_while_waiting(job_trigger(load_config(None), handle, "running", 30), {"launch": "failed"}, monkeypatch,
                             cancels=5, answer_delay_s=0.3)
        process.wait(timeout=15)
        assert not process_alive(process.pid)
    finally:
        if process_alive(process.pid):
            process.kill()


def test_a_cancelled_export_wait_cancels_the_job_once_and_only_when_the_task_was_marked_failed(cloud, monkeypatch):
    cloud.vertex = FakeVertex(running_polls=10**6)
    config = gcp_test_config("dataflow.poll_interval_s=0.01")

    def cancels():
        return [request for name, request in cloud.vertex.requests if name == "cancel_custom_job"]

    cancel_while_waiting(job_trigger(config, vertex_handle(), "done", 30), {"launch": "deferred"}, monkeypatch)
    assert cancels() == []  # a triggerer restart: the export goes on, for the next triggerer to wait on
    cancel_while_waiting(job_trigger(config, vertex_handle(), "done", 30), {"launch": "failed"}, monkeypatch)
    (cancel,) = cancels()
    assert cancel.name == vertex_handle().name


# -- the operators' cancel_on_kill and poll_interval, carried by every job trigger ---------------------------------


def test_cancel_on_kill_false_leaves_the_job_running_on_every_job_trigger(cloud, tmp_path):
    """A task killed with cancel_on_kill=False leaves its job alone (no cancel request, no stopped process), and
    each trigger polls at the operator's poll_interval; both survive the triggerer's serialize round trip."""
    import importlib

    cloud.build = FakeCloudBuild(cloud.registry)
    build = JobHandle(kind="cloud-build", id="b7e1c0de", name="b7e1c0de", location="us-central1")
    dataflow = cloud.dataflow.scripted_job(STREAMING_STARTS)
    local, process = start_process(tmp_path, "import time; time.sleep(60)")
    try:
        for config, handle, poll_key in [(gcp_test_config(), vertex_handle(), "poll_interval"),
                                         (gcp_test_config(), build, "poll_interval"),
                                         (gcp_test_config(), dataflow, "poll_interval_s"),
                                         (load_config(None), local, "poll_interval_s")]:
            trigger = job_trigger(config, handle, "done", 30, poll_interval_s=3.0, cancel_on_kill=False)
            classpath, kwargs = trigger.serialize()
            assert (kwargs["cancel_on_kill"], kwargs[poll_key]) == (False, 3.0), classpath
            module, _, name = classpath.rpartition(".")
            asyncio.run(getattr(importlib.import_module(module), name)(**kwargs).on_kill())
        assert [r for r in cloud.vertex.requests if r[0] == "cancel_custom_job"] == []
        assert [r for r in cloud.build.requests if r[0] == "cancel_build"] == []
        assert cloud.dataflow.calls("update_job") == []
        assert process_alive(process.pid)
    finally:
        process.kill()
        process.wait(timeout=15)


# -- the hold runs from the deferral, through a triggerer restart (gpuflow.triggers.settle) --------------------------


def revive(kwargs_of, kwargs=None):
    """The trigger a triggerer builds from ``kwargs_of``'s serialized classpath and kwargs (or ``kwargs``)."""
    import importlib

    classpath, serialized = kwargs_of.serialize()
    module, _, name = classpath.rpartition(".")
    return getattr(importlib.import_module(module), name)(**(kwargs if kwargs is not None else serialized))


def held_event(trigger) -> tuple[dict, float]:
    """The trigger's first event as the triggerer gets it (``run``), and when it came (epoch seconds)."""
    from gpuflow.triggers import first_event as run_first_event

    event = run_first_event(trigger, timeout_s=30)
    return event, time.time()


def ended_process(tmp_path):
    handle, process = start_process(tmp_path, "pass")
    process.wait()
    return handle


def test_a_trigger_rebuilt_after_a_triggerer_restart_holds_only_what_is_left_of_the_hold(tmp_path):
    """The hold's window opened when the task deferred: a triggerer that dies while its trigger holds the event,
    and the next one that rebuilds the trigger from its kwargs, hold it until the deferral's time + settle_s, not
    settle_s again from the rebuilt trigger's start."""
    from gpuflow.triggers.local import LocalProcessTrigger

    handle = ended_process(tmp_path)  # the job is done: the event comes at the first check, and is held
    trigger = LocalProcessTrigger(pid=int(handle.id), log_path=handle.location, until="done", timeout_s=30,
                                  settle_s=1.5)
    before = time.time()
    _, kwargs = trigger.serialize()  # the task defers: Airflow serializes the trigger
    deferred_at = kwargs["deferred_at"]
    assert before <= deferred_at <= time.time()

    async def first_triggerer_dies_while_holding():
        async def first_triggerer():
            return await anext(revive(trigger, kwargs).run())

        waiting = asyncio.create_task(first_triggerer())
        while time.time() < deferred_at + 0.7:  # the first triggerer has the event and holds it
            assert not waiting.done()
            await asyncio.sleep(0.05)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(first_triggerer_dies_while_holding())
    rebuilt = revive(trigger, kwargs)
    assert rebuilt.deferred_at == deferred_at and rebuilt.serialize()[1] == kwargs  # a restart keeps the deferral
    started = time.time()
    event, came = held_event(rebuilt)
    assert event["status"] == "success"
    assert came >= deferred_at + 1.5 - 0.01  # still no sooner than the hold after the deferral
    assert came - started < 1.5 - 0.4  # only what was left of it, not 1.5 s from its own start


def test_a_trigger_rebuilt_once_the_hold_has_passed_yields_at_once(tmp_path):
    from gpuflow.triggers.local import LocalProcessTrigger

    handle = ended_process(tmp_path)
    trigger = LocalProcessTrigger(pid=int(handle.id), log_path=handle.location, until="done", timeout_s=30,
                                  settle_s=1.5)
    _, kwargs = trigger.serialize()
    # the next triggerer starts 2 s after the deferral (its kwargs as Airflow keeps them, the deferral 2 s earlier)
    rebuilt = revive(trigger, {**kwargs, "deferred_at": kwargs["deferred_at"] - 2.0})
    started = time.time()
    event, came = held_event(rebuilt)
    assert event["status"] == "success" and came - started < 0.4


def test_a_deferral_time_ahead_of_the_triggerers_clock_holds_no_longer_than_settle_s(tmp_path):
    """A worker whose clock runs ahead of the triggerer's does not stretch the hold past settle_s."""
    from gpuflow.triggers.local import LocalProcessTrigger

    handle = ended_process(tmp_path)
    trigger = LocalProcessTrigger(pid=int(handle.id), log_path=handle.location, until="done", timeout_s=30,
                                  settle_s=0.5, deferred_at=time.time() + 60)
    started = time.time()
    _, came = held_event(trigger)
    assert 0.5 - 0.01 <= came - started < 0.5 + 0.4


def test_the_deferral_time_is_taken_when_the_task_defers_not_when_it_built_the_trigger(tmp_path, monkeypatch):
    """A task builds its trigger, waits for it up to HOLD_S in its worker, then defers: Airflow serializes the
    trigger then (the task runner's TaskDeferred handling), and that is the deferral's time."""
    try:
        from airflow.sdk.exceptions import TaskDeferred
    except ImportError:  # Airflow 3.1 (Composer's floor) raises the core one
        from airflow.exceptions import TaskDeferred

    from gpuflow.triggers import settle
    from tests.unit.test_deferral import SleepOperator

    monkeypatch.setattr(settle, "HOLD_S", 0.5)
    operator = SleepOperator(job_s=30, log_path=tmp_path / "job.log")
    built = time.time()
    try:
        with pytest.raises(TaskDeferred) as deferred:
            operator.execute({})
        deferring = time.time()
        _, kwargs = deferred.value.trigger.serialize()
        assert kwargs["deferred_at"] >= deferring >= built + 0.5
        assert kwargs["settle_s"] == deferred.value.trigger.settle_s
    finally:
        ChildProcess(operator.pid).kill()
        ChildProcess(operator.pid).wait()


def every_gpuflow_trigger():
    """One of each gpuflow trigger class, built as its task builds it."""
    from gpuflow.triggers.answers import SmokeAnswersTrigger
    from gpuflow.triggers.batch_input import BoundedGcsBlobTrigger, LocalInputTrigger
    from gpuflow.triggers.cancelling import CancellingDataprocBatchTrigger
    from gpuflow.triggers.monitoring import GpuMetricsTrigger

    config = gcp_test_config()
    build = JobHandle(kind="cloud-build", id="b7e1c0de", name="b7e1c0de", location="us-central1")
    dataflow = JobHandle(kind="dataflow", id="2024-01-01_00_00_00-1", name="job", location="us-central1")
    local = JobHandle(kind="local-process", id="1", name="pipeline", location="/tmp/pipeline.log")
    carried = {"handle": "h"}
    return [
        *(job_trigger(config, handle, "done", 30, carried=carried) for handle in (vertex_handle(), build, dataflow)),
        job_trigger(load_config(None), local, "done", 30, carried=carried),
        CancellingDataprocBatchTrigger(batch_id="b-1", project_id=GCP_TEST_PROJECT, region="us-central1",
                                       timeout_s=30),
        SmokeAnswersTrigger(project=GCP_TEST_PROJECT, answers_subscription="a", dead_letter_subscription="d",
                            ids=["p-1"], pending=["p-1"], started=1.0, deadline=2.0, gcp_conn_id="c", carried=carried),
        GpuMetricsTrigger(project_id=GCP_TEST_PROJECT, job_id="j", metrics={"utilization": "m"}, started=1.0,
                          ended=2.0, timeout_s=30, carried=carried),
        LocalInputTrigger("/tmp/in/*.jsonl", "http://localhost:9023", GCP_TEST_PROJECT, 30, 1.0),
        BoundedGcsBlobTrigger(bucket="b", object_name="in/*.jsonl", use_glob=True, poke_interval=1.0,
                              google_cloud_conn_id="c", hook_params={}, timeout_s=30),
    ]


def test_every_gpuflow_trigger_keeps_its_deferral_time_through_the_triggerers_round_trip():
    """Each class's serialize() -> class(**kwargs) keeps deferred_at (and settle_s, carried): a triggerer that
    restarts rebuilds the same hold. The list covers every class that holds its events."""
    from gpuflow.triggers import answers, batch_input, dataflow, local, monitoring  # noqa: F401 - their classes
    from gpuflow.triggers.cancelling import _TimeoutAndCancel
    from gpuflow.triggers.settle import SettlingTrigger

    def subclasses(cls):
        return {cls, *(sub for direct in cls.__subclasses__() for sub in subclasses(direct))}

    triggers = every_gpuflow_trigger()
    holding = {cls for cls in subclasses(SettlingTrigger) | subclasses(_TimeoutAndCancel)
               if cls.__module__.startswith("gpuflow.")} - {SettlingTrigger, _TimeoutAndCancel}
    assert holding <= {type(trigger) for trigger in triggers}
    for trigger in triggers:
        assert trigger.deferred_at is None  # not deferred yet
        before = time.time()
        classpath, kwargs = trigger.serialize()
        assert before <= kwargs["deferred_at"] <= time.time(), classpath
        rebuilt = revive(trigger, kwargs)
        assert type(rebuilt) is type(trigger) and rebuilt.deferred_at == kwargs["deferred_at"], classpath
        assert rebuilt.serialize() == (classpath, kwargs), classpath  # and again, at the next restart
