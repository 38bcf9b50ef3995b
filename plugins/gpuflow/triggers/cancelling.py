"""The provider's Vertex AI, Cloud Build and Dataproc batch triggers, with what gpuflow adds: ``on_kill`` and a
timeout.

Provider gap (apache-airflow-providers-google 22.8.0 and 22.2.0; ``tests/unit/test_provider_gaps.py``):
``CustomJobTrigger``, ``CloudBuildCreateBuildTrigger`` and ``DataprocBatchTrigger`` wait for their job, without end, and leave it running when a user kills the deferred task (mark failed, clear). An export on an
e2-highmem-16, a build on an E2_HIGHCPU_8 machine or a Spark batch on GPU executors would go on billing. So these cancel the job, through the provider's own hooks, when a
user kills the task, and when the job outlasts the configuration's timeout (export.timeout_s,
container.build_timeout_s, dataproc.timeout_s): they then end with an error event that says so.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.providers.google.cloud.triggers.cloud_build import CloudBuildCreateBuildTrigger
from airflow.providers.google.cloud.triggers.dataproc import DataprocBatchTrigger
from airflow.triggers.base import TriggerEvent

from gpuflow.triggers.kill import stopping_job_when_killed
from gpuflow.triggers.settle import HOLD_S, settle_kwargs, settled, with_carried

try:  # the provider's (22.8.0); Composer's 22.2.0 (the floor) and 22.2.2 have none: gpuflow's copy of it
    from airflow.providers.google.cloud.triggers.vertex_ai import CustomJobTrigger
except ImportError:
    from gpuflow.triggers.vertex_custom_job import CustomJobTrigger  # type: ignore[assignment]


class _TimeoutAndCancel:
    """Mixed into a provider trigger: its run(), bounded by ``timeout_s``, then cancel_job() (``events``); its event
    held until ``settle_s`` after the deferral (``deferred_at``; ``run``, ``gpuflow.triggers.settle``); on_kill()
    cancels the job unless ``cancel_on_kill`` is False, and is also called when the task is killed on a triggerer
    that does not call it (``gpuflow.triggers.kill``). It adds these to the trigger's arguments and serializes under
    the subclass's own classpath."""

    timeout_status = "error"  # the status of the event that ends the wait at the timeout

    def __init__(self, *, timeout_s: float, cancel_on_kill: bool = True, settle_s: float = HOLD_S,
                 carried: dict[str, Any] | None = None, deferred_at: float | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.timeout_s, self.cancel_on_kill, self.settle_s = timeout_s, cancel_on_kill, settle_s
        # what the task needs when it goes on, echoed in the event, and when it deferred (SettlingTrigger's)
        self.carried, self.deferred_at = carried, deferred_at

    @property
    def what(self) -> str:
        """The job, in the timeout's message."""
        raise NotImplementedError

    def serialize(self) -> tuple[str, dict[str, Any]]:
        _, kwargs = super().serialize()  # type: ignore[misc]
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {**kwargs, "timeout_s": self.timeout_s, "cancel_on_kill": self.cancel_on_kill,
                 **settle_kwargs(self)})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        held = settled(self.events(), self.settle_s, self.deferred_at, self.log)  # type: ignore[attr-defined]
        async for event in stopping_job_when_killed(self, held):
            yield TriggerEvent(with_carried(event.payload, self.carried))

    async def events(self) -> AsyncIterator[TriggerEvent]:
        """The provider trigger's wait, bounded by ``timeout_s``: what ``run`` holds, and what a worker waits for."""
        events = super().run()  # type: ignore[misc]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        try:
            while True:
                try:
                    event = await asyncio.wait_for(anext(events), max(0.0, deadline - loop.time()))
                except StopAsyncIteration:
                    return
                yield event
        except TimeoutError:  # the wait's own bound: the job is cancelled whatever cancel_on_kill says
            await self.cancel_job()
            yield TriggerEvent({"status": self.timeout_status, "message": self.timeout_message()})
        finally:
            await events.aclose()

    async def on_kill(self) -> None:
        """The task was killed while deferred: cancel its job, unless ``cancel_on_kill`` is False."""
        if self.cancel_on_kill:
            await self.cancel_job()
        else:
            self.log.info("task killed: cancel_on_kill is False, so %s goes on", self.what)  # type: ignore[attr-defined]

    async def cancel_job(self) -> None:
        raise NotImplementedError

    def timeout_message(self) -> str:
        return f"{self.what} did not finish within {self.timeout_s:.0f}s and was cancelled"


class CancellingCustomJobTrigger(_TimeoutAndCancel, CustomJobTrigger):
    @property
    def what(self) -> str:
        return f"Vertex AI custom job {self.custom_job_id}"

    async def cancel_job(self) -> None:
        client = await self.async_hook.get_job_service_client(region=self.location)
        await client.cancel_custom_job(
            request={"name": client.custom_job_path(self.project_id, self.location, self.custom_job_id)})
        self.log.info("requested the cancellation of %s", self.what)


class CancellingCloudBuildTrigger(_TimeoutAndCancel, CloudBuildCreateBuildTrigger):
    @property
    def what(self) -> str:
        return f"Cloud Build {self.id_}"

    async def cancel_job(self) -> None:
        from airflow.providers.google.cloud.hooks.cloud_build import CloudBuildHook
        from asgiref.sync import sync_to_async

        hook = CloudBuildHook(gcp_conn_id=self.gcp_conn_id, impersonation_chain=self.impersonation_chain)
        await sync_to_async(hook.cancel_build)(id_=self.id_, project_id=self.project_id, location=self.location)
        self.log.info("requested the cancellation of %s", self.what)


class CancellingDataprocBatchTrigger(_TimeoutAndCancel, DataprocBatchTrigger):
    """The provider's DataprocBatchTrigger (it has no on_kill for batches), cancelling the batch's operation."""

    @property
    def what(self) -> str:
        return f"Dataproc batch {self.batch_id}"

    async def cancel_job(self) -> None:
        from asgiref.sync import sync_to_async

        hook = self.get_sync_hook()  # type: ignore[no-untyped-call]  # (the provider's, unannotated)
        await sync_to_async(cancel_dataproc_batch)(hook, self.batch_id, self.region, self.project_id)
        self.log.info("requested the cancellation of %s", self.what)


def cancel_dataproc_batch(hook: Any, batch_id: str, region: str, project_id: str) -> None:
    """Cancel a batch through the operation that created it (``Batch.operation``), with the provider's DataprocHook:
    the batch ends CANCELLED."""
    batch = hook.get_batch(batch_id=batch_id, region=region, project_id=project_id)
    if batch.operation:
        hook.get_operations_client(region).cancel_operation(name=batch.operation)
