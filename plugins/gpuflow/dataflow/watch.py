"""What a Dataflow job's state, messages and autoscaling events say about its start.

The provider's Dataflow triggers wait for a job state. A GPU job needs more, and this is the gap gpuflow fills:
Dataflow keeps a job RUNNING while it retries a zone with no free GPUs, and RUNNING comes before any worker
is up. So the watch reads the job's messages too:
- the worker pool is up when Dataflow writes "Workers have started successfully." or "All workers have finished
  the startup processes and began to receive work requests." (some service versions write them at
  JOB_MESSAGE_DETAILED importance, so messages are read at DETAILED and above), or when any autoscaling event's
  ``current_num_workers`` is above 0 (as Google's Dataflow samples read the worker count);
- an error that a fallback can fix (ZONE_RESOURCE_POOL_EXHAUSTED, in a zone or region-wide) ends the wait at once.

It holds no client: the trigger (``gpuflow.triggers.dataflow``) feeds it what ``AsyncDataflowHook`` reads.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

log = logging.getLogger(__name__)

WORKERS_STARTED = re.compile(r"Workers have started successfully|All workers have finished the startup processes",
                             re.I)

Until = Literal["running", "done", "stopped"]


@dataclass(frozen=True)
class JobOutcome:
    status: Literal["success", "failed", "timeout"]
    message: str

    def event(self, **extra: Any) -> dict[str, Any]:
        return {"status": self.status, "message": self.message, **extra}


#: Dataflow's job states from which a job does not move on, by name (the REST API's and the JobState enum's).
TERMINAL_STATES = frozenset({"JOB_STATE_DONE", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_DRAINED",
                             "JOB_STATE_UPDATED", "JOB_STATE_STOPPED"})
#: Those that end a job without its work done.
ENDED_UNDONE = TERMINAL_STATES - {"JOB_STATE_DONE"}


@dataclass
class DataflowStartWatch:
    """Fed one poll at a time; says when the job reached ``until`` (running with workers up, done, or stopped)."""

    job_id: str
    until: Until
    seen: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    workers_started: bool = False

    def _diagnosis(self) -> str:
        from gpuflow.gpus.troubleshoot import classify

        diagnosis = classify("\n".join(self.errors))
        return f" Cause: {diagnosis.cause}. Fix: {diagnosis.fix}." if diagnosis else ""

    def observe(self, state: Any, messages: Iterable[Any], autoscaling_events: Iterable[Any],
                elapsed_s: float, job_type: Any = None) -> JobOutcome | None:
        """One poll's job state, messages (DETAILED and above), autoscaling events and the job's type; None while
        still waiting."""
        from google.cloud import dataflow_v1beta3

        from gpuflow.gpus.troubleshoot import classify

        state = dataflow_v1beta3.JobState(state)
        if self.until == "running" and job_type == dataflow_v1beta3.JobType.JOB_TYPE_BATCH:
            # Only a streaming job keeps running; a batch one would end, and the prompts would wait for nothing.
            return JobOutcome("failed", f"Dataflow job {self.job_id} runs as a batch job, and a streaming job was "
                                        "launched: its request was not staged as streaming. Fix: launch it with "
                                        "--streaming (gpuflow's streaming launch stages it so).")
        if self.until == "stopped":
            if state.name in TERMINAL_STATES:
                return JobOutcome("success", f"Dataflow job {self.job_id} is {state.name}")
            log.info("Dataflow job %s: %s (%.0fs)", self.job_id, state.name, elapsed_s)
            return None
        # Any event with workers running says they started: a later event (a new target, say) must not hide it.
        running = max((event.current_num_workers for event in autoscaling_events), default=0)
        if running > 0 and not self.workers_started:
            log.info("  autoscaling: %d worker(s) running", running)
            self.workers_started = True
        for message in messages:
            if message.id in self.seen:
                continue
            self.seen.add(message.id)
            importance = dataflow_v1beta3.JobMessageImportance(message.message_importance)
            log.log(logging.DEBUG if importance == importance.JOB_MESSAGE_DETAILED else logging.INFO,
                    "  [%s] %s", importance.name, message.message_text)
            if WORKERS_STARTED.search(message.message_text):
                self.workers_started = True
            if importance == importance.JOB_MESSAGE_ERROR:
                self.errors.append(message.message_text)
                diagnosis = classify(message.message_text)
                if diagnosis and diagnosis.try_fallback:
                    return JobOutcome("failed", f"Dataflow job {self.job_id}: {message.message_text}{self._diagnosis()}")
        if state.name in ENDED_UNDONE:
            return JobOutcome("failed", f"Dataflow job {self.job_id} ended {state.name}: "
                                        f"{' | '.join(self.errors) or 'no error message'}.{self._diagnosis()}")
        if self.until == "done" and state == dataflow_v1beta3.JobState.JOB_STATE_DONE:
            return JobOutcome("success", f"Dataflow job {self.job_id} is done ({elapsed_s:.0f}s)")
        if self.until == "running" and state == dataflow_v1beta3.JobState.JOB_STATE_RUNNING and self.workers_started:
            return JobOutcome("success", f"Dataflow job {self.job_id} is running and its workers have started "
                                         f"({elapsed_s:.0f}s)")
        log.info("Dataflow job %s: %s, %s (%.0fs)", self.job_id, state.name,
                 "workers started" if self.workers_started else "waiting for GPU workers", elapsed_s)
        return None

    def timed_out(self, timeout_s: float) -> JobOutcome:
        if self.until == "stopped":
            return JobOutcome("timeout", f"Dataflow job {self.job_id} has not stopped within {timeout_s:.0f}s; "
                                         "it is still stopping")
        if not self.workers_started:
            self.errors.append("no worker activity has been seen")
        return JobOutcome("timeout", f"Dataflow job {self.job_id} did not reach {self.until} within {timeout_s:.0f}s "
                                     f"({' | '.join(self.errors) or 'workers started'})."
                                     f"{self._diagnosis() or ' Fix: read the job logs.'}")
