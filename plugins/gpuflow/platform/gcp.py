"""The gcp profile: one Platform made of a part per Google service (each in its own module).

- export: a Vertex AI custom job (gcp_vertex.VertexExport);
- image: Cloud Build into Artifact Registry (gcp_build.CloudBuildImages);
- Dataflow jobs: staged by Beam, started by the Templates or Flex Templates API, watched, stopped
  (gcp_dataflow.DataflowJobs; their options in dataflow_options);
- here: the GPU check job (started here; its task defers on gpuflow.triggers.dataflow) and the quota from Compute
  Engine. The GPU usage is read from Cloud Monitoring in the smoke test's trigger (gpuflow.triggers.monitoring).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from gpuflow.dataflow.gpu_options import accelerator_hint, right_fitting
from gpuflow.dataflow.options import job_name_for
from gpuflow.platform.base import JobHandle, ZonesOffering
from gpuflow.platform.gcp_build import CloudBuildImages
from gpuflow.platform.gcp_dataflow import DataflowJobs
from gpuflow.platform.gcp_vertex import VertexExport
from gpuflow.runs.naming import ResourceNames

if TYPE_CHECKING:
    from gpuflow.platform.gcp_access import GcpAccessProbe

log = logging.getLogger(__name__)


class GcpPlatform(VertexExport, CloudBuildImages, DataflowJobs):
    """Google Cloud behind the Platform protocol; each part uses the same config, clients and GCS hook."""

    def start_gpu_check(self, names: ResourceNames, image: str) -> JobHandle:
        """beam_jobs/gpu_check.py as a batch Dataflow job on the GPU workers; its report comes back through GCS."""
        argv = ["--report", names.gcs_uri("gpu-check", "report.json")]
        if self.config.require_gpu:
            argv.append("--require-gpu")
        if right_fitting(self.config):  # the GPU comes with the hint alone
            argv += ["--accelerator-hint", accelerator_hint(self.config)]
        return self.start_job("gpu_check.py", argv, names, image, job_name_for(names, self.config, "gpu-check"),
                              streaming=False)

    def find_gpu_check(self, names: ResourceNames) -> JobHandle | None:
        """The run's GPU check job still active in Dataflow, by its exact name (one that ended is not waited on)."""
        name = job_name_for(names, self.config, "gpu-check")
        return next((handle for handle in self.find_run_jobs(names) if handle.name == name), None)

    def gpu_check_report(self, names: ResourceNames, handle: JobHandle) -> dict[str, Any]:
        report_uri = names.gcs_uri("gpu-check", "report.json")
        report = json.loads(self._gcs().download(names.bucket, report_uri.removeprefix(f"gs://{names.bucket}/")))
        return {**report, "job_id": handle.id}

    def gpu_usage(self, handle: JobHandle | None, started: float, ended: float) -> None:
        """Read in the smoke test's trigger: Dataflow's GPU metrics reach Cloud Monitoring with a delay."""
        return None

    @property
    def zones_offering(self) -> ZonesOffering:
        """The region's zones that offer the GPU type now, from Compute Engine (preflight's region check)."""
        return self._zones_offering

    def _zones_offering(self, gpu_type: str, region: str) -> list[str]:
        from gpuflow.gpus.quota import zones_offering

        return zones_offering(self.config.project, gpu_type, region, self.clients.compute_accelerator_types())

    def access_probe(self, impersonation_chain: list[str] | None = None) -> GcpAccessProbe:
        """Preflight's access check reads the project through the connection's own clients, or as the last account
        of ``impersonation_chain`` (another identity's view: the environment's service account, from a shell)."""
        from gpuflow.platform.gcp_access import GcpAccessProbe
        from gpuflow.platform.gcp_clients import GcpClients

        clients = GcpClients(self.conn_id, impersonation_chain) if impersonation_chain else self.clients
        return GcpAccessProbe(self.config.project, self.config.region, clients)

    def gpu_capacity(self) -> dict[str, Any]:
        """The region's GPU quota and the project-wide GPUS_ALL_REGIONS; ``enough`` is False only when a quota
        is known to be too small (an unknown one is reported with its fix)."""
        from gpuflow.gpus.quota import gpu_quota

        readings = gpu_quota(self.config, self.clients.compute(), regions=[self.config.region])
        return {"source": "compute-quota", "readings": [r.as_dict() for r in readings],
                "enough": all(r.enough is not False for r in readings)}
