"""Wait in the triggerer until Cloud Monitoring has a Dataflow job's GPU metrics for the smoke test's window."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import TriggerEvent

from gpuflow.triggers.settle import HOLD_S, SettlingTrigger


def gpu_usage_trigger(config: Any, job_id: str, started: float, ended: float,
                      carried: dict[str, Any] | None = None) -> GpuMetricsTrigger:
    """The trigger the smoke test defers to until Cloud Monitoring has the job's GPU metrics for [started, ended]
    (epoch seconds); Dataflow's workers send them with a delay (smoke_test.gpu_usage_timeout_s). Its event echoes
    ``carried``."""
    smoke = config.smoke_test
    return GpuMetricsTrigger(
        project_id=config.project, job_id=job_id, started=started, ended=ended,
        metrics={"utilization": smoke.gpu_utilization_metric, "memory_utilization": smoke.gpu_memory_metric},
        timeout_s=smoke.gpu_usage_timeout_s, **config.hook_identity(),
        poll_interval_s=config.dataflow.poll_interval_s, carried=carried)


class GpuMetricsTrigger(SettlingTrigger):
    def __init__(self, project_id: str, job_id: str, metrics: dict[str, str], started: float, ended: float,
                 timeout_s: float, gcp_conn_id: str = "google_cloud_default",
                 impersonation_chain: list[str] | None = None, poll_interval_s: float = 10.0, settle_s: float = HOLD_S,
                 carried: dict[str, Any] | None = None, deferred_at: float | None = None):
        super().__init__(settle_s, carried, deferred_at)
        self.project_id, self.job_id, self.metrics = project_id, job_id, metrics
        self.started, self.ended, self.timeout_s = started, ended, timeout_s
        self.gcp_conn_id, self.impersonation_chain = gcp_conn_id, impersonation_chain
        self.poll_interval_s = poll_interval_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self._with_settle("gpuflow.triggers.monitoring.GpuMetricsTrigger", {
            "project_id": self.project_id, "job_id": self.job_id, "metrics": self.metrics, "started": self.started,
            "ended": self.ended, "timeout_s": self.timeout_s, "gcp_conn_id": self.gcp_conn_id,
            "impersonation_chain": self.impersonation_chain, "poll_interval_s": self.poll_interval_s})

    async def _read(self, client: Any, requests: dict[str, Any]) -> dict[str, list[float]]:
        from gpuflow.platform.gpu_metrics import point_values

        readings: dict[str, list[float]] = {}
        for label, request in requests.items():
            readings[label] = point_values([series async for series in await client.list_time_series(request=request)])
        return readings

    async def events(self) -> AsyncIterator[TriggerEvent]:
        from asgiref.sync import sync_to_async

        from gpuflow.platform import gcp_clients
        from gpuflow.platform.gpu_metrics import metric_requests, no_readings, usage_summary

        client = await sync_to_async(gcp_clients.GcpClients(self.gcp_conn_id, self.impersonation_chain).monitoring_async)()
        requests = metric_requests(self.project_id, self.metrics, self.job_id, self.started, self.ended)
        started = time.monotonic()
        while True:
            readings = await self._read(client, requests)
            if all(readings.values()):
                yield TriggerEvent({"status": "success", "usage": usage_summary(self.job_id, readings)})
                return
            if time.monotonic() - started > self.timeout_s:
                yield TriggerEvent({"status": "timeout", "usage": no_readings(self.job_id, self.timeout_s)})
                return
            self.log.info("waiting for the GPU metrics of job %s to reach Cloud Monitoring", self.job_id)
            await asyncio.sleep(self.poll_interval_s)
