"""The launch operator starts the pipeline, pushes its handle and defers; its on_kill stops the process."""

import time
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import TaskDeferred

from gpuflow.operators.streaming import LaunchPipelineOperator
from gpuflow.platform.emulators import process_alive
from gpuflow.platform.local import LocalPlatform
from gpuflow.runs.naming import resource_names
from gpuflow.steps.cleanup import delete_run_resources, request_stops
from gpuflow.steps.resources import create_resources
from tests.helpers import RecordingTI


def test_on_kill_stops_the_pipeline_process(local_config, emulators):
    names = resource_names(local_config, "gf-onkill")
    platform = LocalPlatform(local_config)
    operator = LaunchPipelineOperator(task_id="launch", config_json=local_config.model_dump(mode="json"))
    ti = RecordingTI()
    with platform.environment():
        create_resources(local_config, names, platform.conn_id)
        try:
            with pytest.raises(TaskDeferred) as deferred:
                operator.execute_step(local_config, names, platform, {"ti": ti})
            handle = ti.pushed["job_handle"]
            pid = int(handle["id"])
            trigger = deferred.value.trigger
            assert (type(trigger).__name__, trigger.pid, trigger.until) == ("LocalProcessTrigger", pid, "running")
            # execute_complete gets the handle back in the trigger's event (its carried), not through an XCom
            assert deferred.value.method_name == "execute_complete" and trigger.carried["handle"] == handle
            assert process_alive(pid)
            operator.on_kill()
            deadline = time.monotonic() + 15
            while process_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert not process_alive(pid)
        finally:
            cleanup(local_config, names, platform)


def test_setup_is_idempotent_a_rerun_with_the_same_names_succeeds(local_config, emulators):
    from gpuflow.steps.resources import list_run_resources

    names = resource_names(local_config, "gf-twice")
    platform = LocalPlatform(local_config)
    with platform.environment():
        try:
            first = create_resources(local_config, names, platform.conn_id)
            second = create_resources(local_config, names, platform.conn_id)
            assert first["bucket_created"] is True and second["bucket_created"] is False
            assert sorted(list_run_resources(local_config, names, platform.conn_id)["topics"]) == sorted(names.topics)
        finally:
            cleanup(local_config, names, platform)


def test_deferrable_false_waits_in_the_worker_and_cancel_on_kill_false_leaves_the_pipeline(local_config,
                                                                                             emulators, monkeypatch):
    """The same launch, never deferred: execute returns the running pipeline's handle once the trigger says its
    workers are up; killed with cancel_on_kill=False, the task leaves the pipeline to the run's cleanup."""
    from gpuflow.operators.base import names_for

    def no_deferral(*args, **kwargs):
        raise AssertionError("deferrable=False deferred")

    monkeypatch.setattr(LaunchPipelineOperator, "defer", no_deferral)
    context = {"ti": RecordingTI(), "dag": SimpleNamespace(dag_id="gf_in_worker"), "run_id": "manual__1"}
    names = names_for(context, local_config)
    platform = LocalPlatform(local_config)
    operator = LaunchPipelineOperator(task_id="launch", config_json=local_config.model_dump(mode="json"),
                                      deferrable=False, cancel_on_kill=False, poll_interval=0.2)
    with platform.environment():
        create_resources(local_config, names, platform.conn_id)
    try:
        handle = operator.execute(context)
        assert handle == context["ti"].pushed["job_handle"] and handle["kind"] == "local-process"
        pid = int(handle["id"])
        assert process_alive(pid)
        operator.on_kill()  # with cancel_on_kill, this stops the process group before it returns
        assert process_alive(pid)
    finally:
        with platform.environment():
            cleanup(local_config, names, platform)


def cleanup(config, names, platform):
    delete_run_resources(config, names, platform, [h.id for h in request_stops(names, platform, None)])


def test_a_retried_gpu_check_waits_on_the_check_its_first_try_started(local_config, monkeypatch):
    """verify_gpu at its second try (Airflow's defer-exit race, a lost worker) starts no second check: it defers on
    the process the first try started, found by its pid file; once that check is stopped, a try starts its own."""
    from gpuflow.operators.streaming import VerifyGpuOperator
    from gpuflow.triggers import settle

    monkeypatch.setattr(settle, "HOLD_S", 0.0)  # defer at once: the test reads the trigger
    config = local_config.model_copy(update={"gpu": local_config.gpu.model_copy(update={"type": "nvidia-tesla-t4"})})
    names = resource_names(config, "gf-retried-check")
    platform = LocalPlatform(config)
    operator = VerifyGpuOperator(task_id="verify_gpu", config_json=config.model_dump(mode="json"))

    def deferred_on() -> int:
        with platform.environment(), pytest.raises(TaskDeferred) as deferred:
            operator.execute_step(config, names, platform, {"ti": RecordingTI()})
        return deferred.value.trigger.pid

    first = deferred_on()
    try:
        assert deferred_on() == first  # the retry waits on the first try's check
        assert [handle.id for handle in platform.find_run_jobs(names)] == [str(first)]
        platform.stop_pipeline(platform.find_gpu_check(names))
        second = deferred_on()
        assert second != first
    finally:
        for handle in platform.find_run_jobs(names):
            platform.stop_pipeline(handle)
