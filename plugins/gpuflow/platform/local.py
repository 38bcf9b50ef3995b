"""The local profile: emulators, Beam's DirectRunner in subprocesses, no cloud account."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpuflow.config import DEMO_MODELS, GpuflowConfig
from gpuflow.config_loading import beam_jobs_dir
from gpuflow.emulators import LOCAL_CONN_ID, emulator_env, emulator_environment, process_alive, stop_process_group
from gpuflow.naming import ResourceNames
from gpuflow.platform.base import ImageBuildResult, JobHandle

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


class LocalPlatform:
    conn_id = LOCAL_CONN_ID

    #: No Compute Engine here: preflight's region check reads the catalog's table.
    zones_offering = None

    def __init__(self, config: GpuflowConfig):
        self.config = config
        self.state_dir = Path(config.local.state_dir)

    # -- environment ------------------------------------------------------------------------
    def environment(self):
        return emulator_environment(self.config)

    def subprocess_env(self) -> dict[str, str]:
        import os

        return {**os.environ, **emulator_env(self.config), "PYTHONUNBUFFERED": "1"}

    def _script(self, name: str) -> str:
        return str(beam_jobs_dir() / name)

    # -- export -----------------------------------------------------------------------------
    def demo_model_dir(self, name: str = "gpuflow-demo") -> Path:
        """An offline demo model (``DEMO_MODELS``), built once per state_dir (it is deterministic)."""
        from gpuflow.demo_model import write_demo_model

        directory = self.state_dir / name.replace("gpuflow-demo", "demo-model")
        if not (directory / "config.json").exists():
            staging = self.state_dir / f"{directory.name}.tmp{time.time_ns()}"
            write_demo_model(staging, architecture=DEMO_MODELS[name])
            shutil.rmtree(directory, ignore_errors=True)
            staging.rename(directory)
        return directory

    def export_model(self, model_name: str, names: ResourceNames) -> None:
        """The export runs here, to its end, in the task's own process tree (nothing to defer on)."""
        source = str(self.demo_model_dir(model_name)) if model_name in DEMO_MODELS else model_name
        run_logged(
            [sys.executable, self._script("download_model.py"), "local", "--model-name", source,
             "--state-dict-path", names.state_dict_uri, "--record-as", model_name,
             *(["--save-pretrained"] if self.config.inference.engine == "vllm" else [])],
            self.subprocess_env(),
            "export (download_model.py local)",
            timeout_s=self.config.export.timeout_s,
        )

    # -- image ------------------------------------------------------------------------------
    def docker_engine_answers(self) -> tuple[bool, str]:
        docker = shutil.which("docker")
        if not docker:
            return False, "no docker client on PATH"
        try:
            probe = subprocess.run([docker, "info", "--format", "{{.ServerVersion}}"], capture_output=True,
                                   text=True, timeout=20, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return False, "docker info timed out"
        if probe.returncode != 0:
            return False, (probe.stderr or probe.stdout).strip().splitlines()[-1] if (probe.stderr or probe.stdout) else "docker info failed"
        return True, f"Docker engine {probe.stdout.strip()}"

    def cancel_export(self, job_name: str) -> None:
        """Nothing to cancel: the local export runs in the task's own process tree."""

    def build_image(self, context_dir: Path, image: str, names: ResourceNames) -> ImageBuildResult:
        answers, detail = self.docker_engine_answers()
        if not answers:
            return ImageBuildResult(
                image=image, built=False, context_dir=str(context_dir),
                detail=f"NOT BUILT: no Docker engine answers here ({detail}). The recipe was rendered and checked statically.",
            )
        run_logged(["docker", "build", "-t", image, str(context_dir)], None, f"docker build {image}")
        return ImageBuildResult(image=image, built=True, context_dir=str(context_dir), detail=f"built with {detail}")

    # -- GPU check --------------------------------------------------------------------------
    def cancel_build(self, build_id: str) -> None:
        """Nothing to cancel: a local build (where a Docker engine answers) runs in the task's process tree."""

    def start_gpu_check(self, names: ResourceNames, image: str) -> JobHandle:
        """gpu_check.py on the local runner, in its own session: the task defers until it ends."""
        command = [sys.executable, self._script("gpu_check.py"), "--report", str(self._gpu_report(names)),
                   f"--runner={self.config.local.runner}"]
        if self.config.require_gpu:
            command.append("--require-gpu")
        return self._start_process(command, f"{names.prefix}-gpu-check", names.job_name + "-gpu-check", names.labels)

    def _gpu_report(self, names: ResourceNames) -> Path:
        return self.state_dir / f"{names.prefix}-gpu-check.json"

    def gpu_check_report(self, names: ResourceNames, handle: JobHandle) -> dict[str, Any]:
        report = self._gpu_report(names)
        if not report.exists():
            raise PipelineStartError(f"the GPU check (pid {handle.id}) ended without its report. Log tail:\n"
                                     + "\n".join(Path(handle.location).read_text(errors="replace").splitlines()[-30:]))
        return json.loads(report.read_text())

    def gpu_usage(self, handle: JobHandle | None, started: float, ended: float) -> dict[str, Any]:
        """nvidia-smi's readings now, where a GPU exists; otherwise says plainly that there is none. (On gcp the
        smoke test reads Cloud Monitoring in its trigger, gpuflow.triggers.monitoring.)"""
        nvidia_smi = shutil.which("nvidia-smi")
        if not nvidia_smi:
            return {"source": "nvidia-smi", "gpus": [], "note": "no GPU on this machine: inference ran on the CPU"}
        query = subprocess.run([nvidia_smi, "--query-gpu=name,utilization.gpu,utilization.memory",
                                "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30,
                               stdin=subprocess.DEVNULL)
        gpus = []
        for line in query.stdout.strip().splitlines():
            name, utilization, memory = (part.strip() for part in line.split(","))
            gpus.append({"name": name, "utilization": float(utilization) / 100,
                         "memory_utilization": float(memory) / 100})
        return {"source": "nvidia-smi", "gpus": gpus,
                "max_utilization": max((g["utilization"] for g in gpus), default=0.0)}

    def gpu_capacity(self) -> dict[str, Any]:
        nvidia_smi = shutil.which("nvidia-smi")
        if nvidia_smi:
            listing = subprocess.run([nvidia_smi, "-L"], capture_output=True, text=True, timeout=30,
                                     stdin=subprocess.DEVNULL)
            gpus = [line for line in listing.stdout.splitlines() if line.startswith("GPU ")]
            return {"source": "nvidia-smi", "gpus": gpus, "count": len(gpus)}
        return {"source": "nvidia-smi", "gpus": [], "count": 0, "note": "nvidia-smi not found: no GPU on this machine"}

    # -- pipeline processes -----------------------------------------------------------------
    def pipeline_command(self, argv: list[str], streaming: bool = True) -> list[str]:
        """The inference pipeline on the local runner (the command `gpuflow launch-command` prints)."""
        return [sys.executable, self._script("llm_inference.py"), *argv, f"--runner={self.config.local.runner}",
                *(["--streaming"] if streaming else []), f"--project={self.config.project}"]

    def _start_process(self, command: list[str], file_stem: str, job_name: str, labels: dict[str, str]) -> JobHandle:
        """Start a pipeline process that outlives the task (cleanup or on_kill stops its whole group). Its labels
        ride in its environment (``GPUFLOW_LABELS``), where the janitor reads them (``job_labels``)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.state_dir / f"{file_stem}.log"
        log.info("starting %s: %s", job_name, " ".join(command))
        pid = spawn_logged(command, log_path, {**self.subprocess_env(), LABELS_VARIABLE: json.dumps(labels)})
        (self.state_dir / f"{file_stem}.pid").write_text(str(pid))
        return JobHandle(kind="local-process", id=str(pid), name=job_name, location=str(log_path))

    def launch_pipeline(self, argv: list[str], names: ResourceNames, image: str = "",
                        streaming: bool = True) -> JobHandle:
        return self._start_process(self.pipeline_command(argv, streaming), f"{names.prefix}-pipeline",
                                   names.job_name, names.labels)

    def job_timeout_s(self, until: str) -> float:
        # The GPU check runs a whole (small) batch pipeline: its start, then its work.
        return self.config.local.pipeline_start_timeout_s + (600 if until == "done" else 0)

    def request_stop(self, handle: JobHandle, drain: bool | None = None) -> bool:
        """A local pipeline process cannot drain: it stops at once. (A persistent deployment's replacement reads a
        subscription of its own, so the old process's prompts are answered by the new one too: gpuflow.naming.)"""
        return self.stop_pipeline(handle)

    def job_running(self, handle: JobHandle) -> bool:
        return gpuflow_process_runs(int(handle.id))

    def update_pipeline(self, argv, names, image, job_name, transform_name_mapping) -> JobHandle:
        raise NotImplementedError("the local DirectRunner cannot update a job in place; gpuflow.rollout plans a "
                                  "replacement on the local profile")

    def stop_pipeline(self, handle: JobHandle) -> bool:
        pid = int(handle.id)
        was_running = gpuflow_process_runs(pid) and stop_process_group(pid)
        log.info("%s (pid %d): %s", handle.name, pid, "stopped" if was_running else "was not running")
        for pid_file in self.state_dir.glob("*.pid"):
            if pid_file.read_text().strip() == handle.id:
                pid_file.unlink(missing_ok=True)
        return was_running

    def find_gpuflow_jobs(self) -> list[JobHandle]:
        """Every gpuflow pipeline process still running (the janitor's view)."""
        return _pid_handles(self.state_dir)

    def job_labels(self, handle: JobHandle) -> dict[str, str]:
        """The labels a pipeline process was started with (its ``GPUFLOW_LABELS``); none for one started otherwise."""
        try:
            environment = Path(f"/proc/{handle.id}/environ").read_bytes().split(b"\0")
        except OSError:
            return {}
        found = next((item.split(b"=", 1)[1] for item in environment
                      if item.startswith(LABELS_VARIABLE.encode() + b"=")), b"{}")
        return json.loads(found)

    def find_run_jobs(self, names: ResourceNames) -> list[JobHandle]:
        """The run's pipeline and GPU check processes, from their pid files."""
        handles = []
        for stem, job_name in ((f"{names.prefix}-pipeline", names.job_name),
                               (f"{names.prefix}-gpu-check", names.job_name + "-gpu-check")):
            pid_file = self.state_dir / f"{stem}.pid"
            if pid_file.exists():
                handles.append(JobHandle(kind="local-process", id=pid_file.read_text().strip(), name=job_name,
                                         location=str(self.state_dir / f"{stem}.log")))
        return handles


def _pid_handles(state_dir: Path) -> list[JobHandle]:
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
