"""The local profile's jobs: the GPU check and the inference pipeline as processes on Beam's local runner, started
detached, found again by their pid files, stopped by process group."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

from gpuflow.platform.base import JobHandle
from gpuflow.platform.emulators import stop_process_group
from gpuflow.platform.local_service import LocalService
from gpuflow.platform.processes import (
    LABELS_VARIABLE,
    PipelineStartError,
    exit_status,
    gpuflow_process_runs,
    pid_handles,
    replace_text,
    spawn_logged,
)
from gpuflow.runs.naming import ResourceNames

log = logging.getLogger(__name__)


class LocalProcesses(LocalService):
    def start_gpu_check(self, names: ResourceNames, image: str) -> JobHandle:
        """gpu_check.py on the local runner, in its own session: the task defers until it ends."""
        command = [sys.executable, self._script("gpu_check.py"), "--report", str(self._gpu_report(names)),
                   f"--runner={self.config.local.runner}"]
        if self.config.require_gpu:
            command.append("--require-gpu")
        return self._start_process(command, f"{names.prefix}-gpu-check", names.job_name + "-gpu-check", names.labels)

    def find_gpu_check(self, names: ResourceNames) -> JobHandle | None:
        """From its pid file (a stopped check has none): running, or ended with exit status 0."""
        found = next((handle for handle in self.find_run_jobs(names) if handle.name == names.job_name + "-gpu-check"),
                     None)
        if found is None or gpuflow_process_runs(int(found.id)) or exit_status(found.location) == 0:
            return found
        return None

    def _gpu_report(self, names: ResourceNames) -> Path:
        return self.state_dir / f"{names.prefix}-gpu-check.json"

    def gpu_check_report(self, names: ResourceNames, handle: JobHandle) -> dict[str, Any]:
        report = self._gpu_report(names)
        if not report.exists():
            raise PipelineStartError(f"the GPU check (pid {handle.id}) ended without its report. Log tail:\n"
                                     + "\n".join(Path(handle.location).read_text(errors="replace").splitlines()[-30:]))
        report_json: dict[str, Any] = json.loads(report.read_text())
        return report_json

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
        replace_text(self.state_dir / f"{file_stem}.pid", str(pid))
        return JobHandle(kind="local-process", id=str(pid), name=job_name, location=str(log_path))

    def launch_pipeline(self, argv: list[str], names: ResourceNames, image: str = "",
                        streaming: bool = True, kind: str = "") -> JobHandle:
        return self._start_process(self.pipeline_command(argv, streaming), f"{names.prefix}-{kind or 'pipeline'}",
                                   f"{names.job_name}-{kind}" if kind else names.job_name, names.labels)

    def job_timeout_s(self, until: str) -> float:
        # The GPU check runs a whole (small) batch pipeline: its start, then its work.
        return self.config.local.pipeline_start_timeout_s + (600 if until == "done" else 0)

    def request_stop(self, handle: JobHandle, drain: bool | None = None) -> bool:
        """A local pipeline process cannot drain: it stops at once. (A persistent deployment's replacement reads a
        subscription of its own, so the old process's prompts are answered by the new one too: gpuflow.runs.naming.)"""
        return self.stop_pipeline(handle)

    def job_running(self, handle: JobHandle) -> bool:
        return gpuflow_process_runs(int(handle.id))

    def update_pipeline(self, argv: list[str], names: ResourceNames, image: str, job_name: str,
                        transform_name_mapping: dict[str, str]) -> JobHandle:
        raise NotImplementedError("the local DirectRunner cannot update a job in place; gpuflow.runs.rollout plans a "
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
        return pid_handles(self.state_dir)

    def job_labels(self, handle: JobHandle) -> dict[str, str]:
        """The labels a pipeline process was started with (its ``GPUFLOW_LABELS``); none for one started otherwise."""
        try:
            environment = Path(f"/proc/{handle.id}/environ").read_bytes().split(b"\0")
        except OSError:
            return {}
        found = next((item.split(b"=", 1)[1] for item in environment
                      if item.startswith(LABELS_VARIABLE.encode() + b"=")), b"{}")
        labels: dict[str, str] = json.loads(found)
        return labels

    def find_run_jobs(self, names: ResourceNames) -> list[JobHandle]:
        """The run's processes (its pipeline, its GPU check, its evaluation jobs), from their pid files."""
        handles = []
        for pid_file in sorted(self.state_dir.glob(f"{names.prefix}-*.pid")):
            kind = pid_file.stem.removeprefix(f"{names.prefix}-")
            handles.append(JobHandle(kind="local-process", id=pid_file.read_text().strip(),
                                     name=names.job_name if kind == "pipeline" else f"{names.job_name}-{kind}",
                                     location=str(pid_file.with_suffix(".log"))))
        return handles


