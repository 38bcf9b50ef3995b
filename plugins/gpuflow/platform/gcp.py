"""The gcp profile: one Platform made of a part per Google service (each in its own module).

- export: a Vertex AI custom job (gcp_vertex.VertexExport);
- image: Cloud Build into Artifact Registry (gcp_build.CloudBuildImages);
- Dataflow jobs: staged by Beam, started by the Templates or Flex Templates API, watched, stopped
  (gcp_dataflow.DataflowJobs; their options in dataflow_options);
- here: the GPU check job (started here; its task defers on gpuflow.triggers.dataflow), the GPU usage from Cloud Monitoring and the quota from Compute Engine.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from gpuflow.naming import ResourceNames
from gpuflow.platform.base import JobHandle
from gpuflow.platform.dataflow_options import gpu_metric_filter, job_name_for
from gpuflow.platform.gcp_build import CloudBuildImages
from gpuflow.platform.gcp_dataflow import DataflowJobs
from gpuflow.platform.gcp_vertex import VertexExport

log = logging.getLogger(__name__)


class GcpPlatform(VertexExport, CloudBuildImages, DataflowJobs):
    """Google Cloud behind the Platform protocol; each part uses the same config, clients and GCS hook."""

    def start_gpu_check(self, names: ResourceNames, image: str) -> JobHandle:
        """beam_jobs/gpu_check.py as a batch Dataflow job on the GPU workers; its report comes back through GCS."""
        argv = ["--report", names.gcs_uri("gpu-check", "report.json")]
        if self.config.require_gpu:
            argv.append("--require-gpu")
        return self.start_job("gpu_check.py", argv, names, image, job_name_for(names, self.config, "gpu-check"),
                              streaming=False)

    def gpu_check_report(self, names: ResourceNames, handle: JobHandle) -> dict[str, Any]:
        report_uri = names.gcs_uri("gpu-check", "report.json")
        report = json.loads(self._gcs().download(names.bucket, report_uri.removeprefix(f"gs://{names.bucket}/")))
        return {**report, "job_id": handle.id}

    def gpu_usage(self, handle: JobHandle | None, started: float, ended: float) -> dict[str, Any]:
        """The job's GPU and GPU memory utilisation over [started, ended] (epoch seconds), from Cloud Monitoring.

        Dataflow's workers send their GPU metrics with a delay, so this waits (smoke_test.gpu_usage_timeout_s)
        until both series have points in the window."""
        from google.cloud import monitoring_v3

        if handle is None:
            return {"source": "cloud-monitoring", "note": "no Dataflow job handle (launch pushed none)"}
        smoke = self.config.smoke_test
        interval = monitoring_v3.TimeInterval(start_time={"seconds": int(started)}, end_time={"seconds": int(ended) + 1})
        readings: dict[str, list[float]] = {}

        def read_all() -> bool:
            for label, metric in (("utilization", smoke.gpu_utilization_metric),
                                  ("memory_utilization", smoke.gpu_memory_metric)):
                series = self.clients.monitoring().list_time_series(request=monitoring_v3.ListTimeSeriesRequest(
                    name=f"projects/{self.config.project}",
                    filter=gpu_metric_filter(metric, handle.id),
                    interval=interval, view=monitoring_v3.ListTimeSeriesRequest.TimeSeriesView.FULL))
                # INT64 percent (the metrics list), read as a fraction like nvidia-smi's readings.
                readings[label] = [(point.value.int64_value or point.value.double_value) / 100
                                   for one in series for point in one.points]
            if all(readings.values()):
                return True
            log.info("waiting for the GPU metrics of job %s to reach Cloud Monitoring", handle.id)
            return False

        try:
            self._wait("GPU metrics", smoke.gpu_usage_timeout_s, read_all)
        except TimeoutError:
            return {"source": "cloud-monitoring", "job_id": handle.id, "samples": 0,
                    "note": f"no GPU metrics for job {handle.id} within {smoke.gpu_usage_timeout_s:.0f}s"}
        return {"source": "cloud-monitoring", "job_id": handle.id, "samples": len(readings["utilization"]),
                "max_utilization": max(readings["utilization"]),
                "mean_utilization": sum(readings["utilization"]) / len(readings["utilization"]),
                "max_memory_utilization": max(readings["memory_utilization"])}

    def zones_offering(self, gpu_type: str, region: str) -> list[str]:
        """The region's zones that offer the GPU type now, from Compute Engine (preflight's region check)."""
        from gpuflow.quota import zones_offering

        return zones_offering(self.config.project, gpu_type, region, self.clients.compute_accelerator_types())

    def gpu_capacity(self) -> dict[str, Any]:
        """The region's GPU quota and the project-wide GPUS_ALL_REGIONS; ``enough`` is False only when a quota
        is known to be too small (an unknown one is reported with its fix)."""
        from gpuflow.quota import gpu_quota

        readings = gpu_quota(self.config, self.clients.compute_regions(), self.clients.compute_projects(),
                             regions=[self.config.region])
        return {"source": "compute-quota", "readings": [r.as_dict() for r in readings],
                "enough": all(r.enough is not False for r in readings)}
