"""The provider's ``CustomJobTrigger``, for the Composer floor's Google provider, which lacks it.

apache-airflow-providers-google 22.8.0 (gpuflow's development pin) has
``airflow.providers.google.cloud.triggers.vertex_ai.CustomJobTrigger``; 22.2.2, the oldest version on Composer's
Airflow 3.3.1 images (``catalog/composer.yaml``), has no such class (read from its wheel: its vertex_ai triggers
are the training-pipeline ones only), though its ``CustomJobAsyncHook.wait_for_custom_job`` is there.
``gpuflow.triggers.cancelling`` imports the provider's where it exists and this one otherwise: the same arguments,
the same wait through the provider's async hook, the same events as 22.8.0's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.providers.common.compat.sdk import AirflowException
from airflow.triggers.base import BaseTrigger, TriggerEvent

if TYPE_CHECKING:
    from airflow.providers.google.cloud.hooks.vertex_ai.custom_job import CustomJobAsyncHook


class CustomJobTrigger(BaseTrigger):
    """Waits until a Vertex AI custom job ends, with the provider's CustomJobAsyncHook."""

    def __init__(self, project_id: str, location: str, custom_job_id: str,
                 gcp_conn_id: str = "google_cloud_default", impersonation_chain: str | Sequence[str] | None = None,
                 poll_interval: int = 10):
        super().__init__()  # type: ignore[no-untyped-call]  # (Airflow's BaseTrigger.__init__ is unannotated)
        self.project_id, self.location, self.custom_job_id = project_id, location, custom_job_id
        self.gcp_conn_id, self.impersonation_chain, self.poll_interval = gcp_conn_id, impersonation_chain, poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"project_id": self.project_id, "location": self.location, "custom_job_id": self.custom_job_id,
                 "gcp_conn_id": self.gcp_conn_id, "impersonation_chain": self.impersonation_chain,
                 "poll_interval": self.poll_interval})

    @cached_property
    def async_hook(self) -> CustomJobAsyncHook:
        from airflow.providers.google.cloud.hooks.vertex_ai.custom_job import CustomJobAsyncHook

        return CustomJobAsyncHook(gcp_conn_id=self.gcp_conn_id, impersonation_chain=self.impersonation_chain)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from google.cloud.aiplatform_v1 import types

        try:
            custom_job = await self.async_hook.wait_for_custom_job(
                project_id=self.project_id, location=self.location, job_id=self.custom_job_id,
                poll_interval=self.poll_interval)
        except (AirflowException, RuntimeError) as problem:
            yield TriggerEvent({"status": "error", "message": str(problem)})
            return
        yield TriggerEvent({"status": "success",
                            "message": f"Custom Job {custom_job.name} completed with status {custom_job.state.name}",
                            "custom_job": types.custom_job.CustomJob.to_dict(custom_job)})
