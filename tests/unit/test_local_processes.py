"""Every process gpuflow starts is detached from the task that starts it (``gpuflow.platform.processes.DETACHED``)."""

import contextlib
import os
import signal
import sys
import threading
import time

import pytest

from gpuflow.platform.processes import replace_text, spawn_logged

pytestmark = pytest.mark.timeout(120)


def test_a_spawned_job_reads_no_stdin_runs_in_its_own_group_and_inherits_no_descriptor(tmp_path):
    """A job that kept the task's fd 0 (Airflow's channel to the task) would hold the deferred task open until the
    job ends, the moment its trigger fires: the race of apache/airflow#67287."""
    read_end, write_end = os.pipe()  # an open descriptor of this "task", and a stdin that is not /dev/null
    os.set_inheritable(write_end, True)
    saved_stdin = os.dup(0)
    os.dup2(read_end, 0)
    try:
        pid = spawn_logged([sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(30)"],
                           tmp_path / "job.log")
    finally:
        os.dup2(saved_stdin, 0)
        os.close(saved_stdin)
    try:
        # The interpreter opens files while it starts; its descriptors are read once it has started its work.
        deadline = time.monotonic() + 20
        while "ready" not in (tmp_path / "job.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert os.readlink(f"/proc/{pid}/fd/0") == "/dev/null"
        assert sorted(int(fd) for fd in os.listdir(f"/proc/{pid}/fd")) == [0, 1, 2]  # the log is 1 and 2
        assert os.readlink(f"/proc/{pid}/fd/1") == str(tmp_path / "job.log")
        assert os.getpgid(pid) == pid and os.getsid(pid) == pid  # its own process group and session
    finally:
        os.killpg(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(read_end)
        os.close(write_end)


def test_a_pid_file_is_never_seen_empty(tmp_path):
    """A run killed just after its pipeline started left a pid file that its finder read as '' (CI of 2cdceb7): the
    file's name now appears only with its whole text."""
    seen: list[str] = []
    done = threading.Event()

    def read_while_written() -> None:
        while not done.is_set():
            for pid_file in tmp_path.glob("*.pid"):
                with contextlib.suppress(FileNotFoundError):
                    seen.append(pid_file.read_text())

    reader = threading.Thread(target=read_while_written)
    reader.start()
    try:
        for pid in range(1000, 3000):
            replace_text(tmp_path / f"run-{pid % 7}.pid", str(pid))
    finally:
        done.set()
        reader.join()
    assert seen and all(text.isdigit() for text in seen)
    assert sorted(path.name for path in tmp_path.iterdir()) == [f"run-{n}.pid" for n in range(7)]
