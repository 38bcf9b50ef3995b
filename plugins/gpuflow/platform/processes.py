"""The local profile's processes: started detached from the task, logged, found again, and known as gpuflow's."""

from __future__ import annotations

import logging
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from gpuflow.platform.base import JobHandle
from gpuflow.platform.emulators import process_alive, stop_process_group

log = logging.getLogger(__name__)

#: The environment variable that carries a local pipeline process's labels (a Dataflow job's, on gcp).
LABELS_VARIABLE = "GPUFLOW_LABELS"
#: The line beam_jobs/llm_inference.py logs once the pipeline runs.
PIPELINE_RUNNING_MARKER = "gpuflow: pipeline running"
MODEL_LOADED_MARKER = "gpuflow: model loaded"


class PipelineStartError(RuntimeError):
    pass


#: How every process gpuflow starts is detached from the task that starts it: no standard input (a task's file
#: descriptor 0 is Airflow's own channel to it; a child that kept it would hold the task open until the child ends,
#: which is the moment its trigger fires: apache/airflow#67287), a session and process group of its own, and no
#: inherited descriptor beyond what it is given for its output.
DETACHED: dict[str, Any] = {"stdin": subprocess.DEVNULL, "start_new_session": True, "close_fds": True}


def exit_status_path(log_path: str | Path) -> Path:
    """Where a pipeline process's exit status is written, beside its log."""
    return Path(f"{log_path}.exit")


def exit_status(log_path: str | Path) -> int | None:
    """The exit status of an ended pipeline process; None when it was stopped before it could write one."""
    try:
        return int(exit_status_path(log_path).read_text().strip())
    except (OSError, ValueError):
        return None


def spawn_logged(command: list[str], log_path: Path, env: dict[str, str] | None = None) -> int:
    """Start ``command`` detached (``DETACHED``), its output appended to ``log_path``; return its pid.

    It outlives the task that started it, so no one can ``wait`` for it: a shell runs it and writes its exit status
    beside the log (``exit_status``), from which a trigger tells a batch job that finished from one that failed."""
    wrapped = ["/bin/sh", "-c", '"$@"; echo $? > "$0"', str(exit_status_path(log_path)), *command]
    exit_status_path(log_path).unlink(missing_ok=True)
    with open(log_path, "ab") as log_file:
        process = subprocess.Popen(wrapped, stdout=log_file, stderr=subprocess.STDOUT, env=env, **DETACHED)
    _wait_for_arguments(process.pid)
    return process.pid


def _wait_for_arguments(pid: int, timeout_s: float = 5.0) -> None:
    """Popen returns once exec has passed its point of no return, before the kernel has set the new program's
    arguments: /proc/<pid>/cmdline reads empty for a moment, and ``is_gpuflow_process`` would take the job for
    someone else's (a task killed at once then left it running). Wait until the arguments are there."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes() or not process_alive(pid):
                return  # (an exited process, a zombie, shows no arguments either: its exit status says why)
        except OSError:
            return
        time.sleep(0.001)


def run_logged(command: list[str], env: dict[str, str] | None, what: str, timeout_s: float = 1800) -> str:
    """Run a subprocess, forward its output to our log line by line, raise with its tail on failure."""
    log.info("%s: %s", what, " ".join(command))
    lines: list[str] = []
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                               **DETACHED)
    deadline = time.monotonic() + timeout_s
    assert process.stdout is not None
    for line in process.stdout:
        line = line.rstrip()
        if line and not line.startswith("WARNING: Location"):
            lines.append(line)
            log.info("  %s", line)
        if time.monotonic() > deadline:
            stop_process_group(process.pid)
            raise TimeoutError(f"{what} did not finish within {timeout_s:.0f}s")
    if process.wait() != 0:
        tail = "\n".join(lines[-30:])
        raise RuntimeError(f"{what} failed with exit code {process.returncode}:\n{tail}")
    return "\n".join(lines)


def replace_text(path: Path, text: str) -> None:
    """Write ``path`` whole, atomically on one filesystem: a reader (the janitor, a killed run's finder) sees no
    file or the whole text, never an empty one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    staging.write_text(text)
    os.replace(staging, path)


def pid_handles(state_dir: Path) -> list[JobHandle]:
    """Every pipeline process whose pid file is in ``state_dir`` and that still runs (named by its file's stem)."""
    handles = []
    for pid_file in sorted(state_dir.glob("*.pid")):
        pid = pid_file.read_text().strip()
        if pid.isdigit() and gpuflow_process_runs(int(pid)):
            handles.append(JobHandle(kind="local-process", id=pid, name=pid_file.stem,
                                     location=str(pid_file.with_suffix(".log"))))
    return handles


def gpuflow_process_runs(pid: int) -> bool:
    """The process still runs (a zombie does not) and is one of gpuflow's jobs."""
    return process_alive(pid) and is_gpuflow_process(pid)


def is_gpuflow_process(pid: int) -> bool:
    """Guards against a recycled pid: only a process running one of gpuflow's Beam jobs is ours to stop."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"llm_inference.py" in command or b"gpu_check.py" in command
