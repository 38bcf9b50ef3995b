"""Wait for a Dataflow job's workers (or its end, or its stop) in the triggerer, on the provider's AsyncDataflowHook.

Provider gap (apache-airflow-providers-google 22.8.0, and Composer's 22.2.0): its Dataflow triggers
(``TemplateJobStartTrigger``, ``DataflowJobStatusTrigger``) wait for a job state. A GPU job is RUNNING long before a
worker with a GPU exists, and stays RUNNING while Dataflow retries a zone with no free GPUs, so this trigger also
reads the job's messages and autoscaling events (``gpuflow.dataflow.watch``). 22.8.0's
``TemplateJobStartTrigger`` cancels its job on kill (``cancel_on_kill``), 22.2.0's does not; this one does on every
line, in ``on_kill``. ``tests/unit/test_provider_gaps.py`` checks each of these against the installed provider.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import TriggerEvent

from gpuflow.triggers.settle import HOLD_S, SettlingTrigger

if TYPE_CHECKING:
    from airflow.providers.google.cloud.hooks.dataflow import AsyncDataflowHook

#: API errors in a row that end the wait (one blip is retried at the next poll).
MAX_POLL_ERRORS = 3


class DataflowJobStateTrigger(SettlingTrigger):
    """Waits until a Dataflow job reaches ``until``: running with its workers started, done, or stopped."""

    def __init__(self, project_id: str, location: str, job_id: str, until: str, timeout_s: float,
                 gcp_conn_id: str = "google_cloud_default", impersonation_chain: Any = None,
                 poll_interval_s: float = 10.0, cancel_on_kill: bool = True, settle_s: float = HOLD_S,
                 carried: dict[str, Any] | None = None, deferred_at: float | None = None):
        super().__init__(settle_s, carried, deferred_at)
        self.project_id, self.location, self.job_id = project_id, location, job_id
        self.until, self.timeout_s, self.poll_interval_s = until, timeout_s, poll_interval_s
        self.gcp_conn_id, self.impersonation_chain, self.cancel_on_kill = gcp_conn_id, impersonation_chain, cancel_on_kill

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self._with_settle("gpuflow.triggers.dataflow.DataflowJobStateTrigger", {
            "project_id": self.project_id, "location": self.location, "job_id": self.job_id, "until": self.until,
            "timeout_s": self.timeout_s, "gcp_conn_id": self.gcp_conn_id,
            "impersonation_chain": self.impersonation_chain, "poll_interval_s": self.poll_interval_s,
            "cancel_on_kill": self.cancel_on_kill})

    def _hook(self) -> AsyncDataflowHook:
        from airflow.providers.google.cloud.hooks.dataflow import AsyncDataflowHook

        return AsyncDataflowHook(gcp_conn_id=self.gcp_conn_id, impersonation_chain=self.impersonation_chain)

    async def _poll(self, hook: AsyncDataflowHook) -> tuple[Any, list[Any], list[Any], Any]:
        from google.cloud import dataflow_v1beta3

        job = await hook.get_job(job_id=self.job_id, project_id=self.project_id, location=self.location)
        if self.until == "stopped":
            return job.current_state, [], [], job.type_
        pager = await hook.list_job_messages(
            job_id=self.job_id, project_id=self.project_id, location=self.location,
            minimum_importance=dataflow_v1beta3.JobMessageImportance.JOB_MESSAGE_DETAILED)
        messages: list[Any] = []
        events: list[Any] = []
        async for page in pager.pages:
            messages += page.job_messages
            events += page.autoscaling_events
        return job.current_state, messages, events, job.type_

    async def events(self) -> AsyncIterator[TriggerEvent]:
        from gpuflow.dataflow.watch import DataflowStartWatch

        hook, watch = self._hook(), DataflowStartWatch(self.job_id, self.until)  # type: ignore[arg-type]
        started = time.monotonic()
        errors = 0
        while True:
            try:
                state, messages, events, job_type = await self._poll(hook)
                errors = 0
            except Exception as error:  # an API blip is retried; three in a row end the wait with the reason
                errors += 1
                self.log.warning("reading Dataflow job %s failed (%d/%d): %s", self.job_id, errors, MAX_POLL_ERRORS,
                                 error)
                if errors >= MAX_POLL_ERRORS:
                    yield TriggerEvent({"status": "error", "job_id": self.job_id,
                                        "message": f"reading Dataflow job {self.job_id} failed: {error}"})
                    return
            else:
                outcome = watch.observe(state, messages, events, time.monotonic() - started, job_type)
                if outcome is not None:
                    yield TriggerEvent(outcome.event(job_id=self.job_id))
                    return
            if time.monotonic() - started > self.timeout_s:
                yield TriggerEvent(watch.timed_out(self.timeout_s).event(job_id=self.job_id))
                return
            await asyncio.sleep(self.poll_interval_s)

    async def on_kill(self) -> None:
        """A user killed the deferred task: cancel the job, so that no GPU keeps billing, with the provider's
        DataflowHook.cancel_job (the async hook has no cancel), off the triggerer's event loop."""
        from airflow.providers.google.cloud.hooks.dataflow import DataflowHook
        from asgiref.sync import sync_to_async

        if not self.cancel_on_kill:
            return
        hook = DataflowHook(gcp_conn_id=self.gcp_conn_id, impersonation_chain=self.impersonation_chain,
                            cancel_timeout=None)
        await sync_to_async(hook.cancel_job)(job_id=self.job_id, project_id=self.project_id, location=self.location)
        self.log.info("task killed: requested the cancellation of Dataflow job %s", self.job_id)
