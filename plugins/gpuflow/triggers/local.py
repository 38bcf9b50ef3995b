"""Wait for one of the local profile's pipeline processes in the triggerer: the streaming pipeline until it runs,
the GPU check until it ends. The process outlives the deferred task (it has its own session)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from airflow.triggers.base import TriggerEvent

from gpuflow.triggers.settle import HOLD_S, SettlingTrigger

#: Seconds between "still waiting" lines in the log.
REPORT_EVERY_S = 10.0


def _log_tail(path: Path, lines: int = 30) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return "\n".join(text.splitlines()[-lines:])


class LocalProcessTrigger(SettlingTrigger):
    def __init__(self, pid: int, log_path: str, until: str, timeout_s: float, poll_interval_s: float = 0.5,
                 cancel_on_kill: bool = True, settle_s: float = HOLD_S,
                 carried: dict[str, Any] | None = None, deferred_at: float | None = None):
        super().__init__(settle_s, carried, deferred_at)
        self.pid, self.log_path, self.until = pid, log_path, until
        self.timeout_s, self.poll_interval_s, self.cancel_on_kill = timeout_s, poll_interval_s, cancel_on_kill

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self._with_settle("gpuflow.triggers.local.LocalProcessTrigger", {
            "pid": self.pid, "log_path": self.log_path, "until": self.until, "timeout_s": self.timeout_s,
            "poll_interval_s": self.poll_interval_s, "cancel_on_kill": self.cancel_on_kill})

    def _check(self) -> dict[str, Any] | None:
        from gpuflow.platform.emulators import process_alive
        from gpuflow.platform.processes import PIPELINE_RUNNING_MARKER, exit_status

        path = Path(self.log_path)
        if self.until == "running" and path.exists() and PIPELINE_RUNNING_MARKER in path.read_text(errors="replace"):
            return {"status": "success", "message": f"the pipeline is running (pid {self.pid}, log {path})"}
        if process_alive(self.pid):
            return None
        if self.until == "done":
            status = exit_status(path)
            if status == 0:
                return {"status": "success", "message": f"process {self.pid} has finished"}
            ended = "was stopped" if status is None else f"failed with exit status {status}"
            return {"status": "failed", "message": f"process {self.pid} {ended}. Log tail:\n{_log_tail(path)}"}
        return {"status": "failed",
                "message": f"the pipeline process {self.pid} exited before it ran. Log tail:\n{_log_tail(path)}"}

    async def events(self) -> AsyncIterator[TriggerEvent]:
        started = last_report = time.monotonic()
        while True:
            event = self._check()
            if event is not None:
                yield TriggerEvent({**event, "job_id": str(self.pid)})
                return
            now = time.monotonic()
            if now - started > self.timeout_s:
                yield TriggerEvent({"status": "timeout", "job_id": str(self.pid), "message": (
                    f"process {self.pid} did not reach {self.until} within {self.timeout_s:.0f}s; see {self.log_path}. "
                    "Fix: raise local.pipeline_start_timeout_s, or read the log for the cause.")})
                return
            if now - last_report > REPORT_EVERY_S:
                self.log.info("waiting for process %d to reach %s (%.0fs)", self.pid, self.until, now - started)
                last_report = now
            await asyncio.sleep(self.poll_interval_s)

    async def on_kill(self) -> None:
        """A user killed the deferred task: stop the process group (only if it still runs one of our scripts)."""
        from gpuflow.platform.emulators import stop_process_group
        from gpuflow.platform.processes import is_gpuflow_process

        if not self.cancel_on_kill:
            self.log.info("task killed: cancel_on_kill is False, so process group %d goes on", self.pid)
        elif is_gpuflow_process(self.pid):
            # Said first: on Airflow 3.1 this runs in the cancelled trigger's cleanup, which a second cancel may cut
            # short; the thread's SIGTERM (sent at once) goes on regardless.
            self.log.info("task killed: stopping process group %d", self.pid)
            await asyncio.to_thread(stop_process_group, self.pid)
            self.log.info("process group %d stopped", self.pid)
        else:  # the run's cleanup, which a killed task lets start at once, may have stopped it first
            self.log.info("task killed: process %d had already ended", self.pid)
