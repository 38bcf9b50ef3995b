"""Stopping the processes gpuflow starts (``gpuflow.platform.emulators``): emulators, pipelines, and in the tests a live
Airflow's components."""

import subprocess
import time

from gpuflow.platform.emulators import process_alive, stop_process_groups

#: A process that logs each SIGTERM it gets and goes on running: only SIGKILL ends it.
STUBBORN = "trap 'echo term >> \"$0\"' TERM; echo ready >> \"$0\"; while true; do sleep 0.05; done"


def test_each_group_gets_one_sigterm_and_what_ignores_it_is_killed(tmp_path):
    """A second SIGTERM may hurry a shutdown under way (an Airflow component's, a pod's), so each group gets one,
    not another when the one before it has had its grace period; the groups that outlive the shared grace period are
    SIGKILLed. A pid already gone is not among those that were running."""
    logs = [tmp_path / f"stubborn-{number}.log" for number in range(2)]
    stubborn = [subprocess.Popen(["bash", "-c", STUBBORN, str(log)], start_new_session=True) for log in logs]
    gone = subprocess.Popen(["true"], start_new_session=True)
    gone.wait()
    deadline = time.monotonic() + 20
    while not all(log.exists() and "ready" in log.read_text() for log in logs):
        assert time.monotonic() < deadline, "the stubborn processes did not start"
        time.sleep(0.05)

    running = stop_process_groups([process.pid for process in stubborn] + [gone.pid], grace_s=1)

    assert running == [process.pid for process in stubborn]
    for process, log in zip(stubborn, logs, strict=True):
        process.wait(timeout=10)
        assert not process_alive(process.pid)
        assert log.read_text().split() == ["ready", "term"], log.read_text()
