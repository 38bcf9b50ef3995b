"""The gcp profile's export: a Vertex AI custom job runs download_model.py with Cloud Storage under /gcs/."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from gpuflow import catalog
from gpuflow.config import beam_jobs_dir
from gpuflow.naming import ResourceNames
from gpuflow.platform.base import JobHandle
from gpuflow.platform.console import vertex_custom_job_url
from gpuflow.platform.gcp_service import GcpService

log = logging.getLogger(__name__)


class VertexJobFailed(RuntimeError):
    pass


class VertexExport(GcpService):
    def export_machine(self) -> tuple[str, int]:
        """The guide's machine and boot disk for the model size, unless the configuration sets them."""
        size = catalog.model_size(self.config.model.name) or catalog.export_size_for(self.config.model.parameters_m or 0)
        return (self.config.export.machine_type or size.export_machine,
                self.config.export.boot_disk_size_gb or size.export_disk_gb)

    def custom_job(self, names: ResourceNames, script_uri: str):
        """The Vertex AI CustomJob that runs download_model.py with Cloud Storage mounted under /gcs/."""
        import shlex

        from google.cloud import aiplatform_v1

        def fuse(uri: str) -> str:
            return "/gcs/" + uri.removeprefix("gs://")

        machine, disk_gb = self.export_machine()
        export = self.config.export
        script = " && ".join([
            "pip install --quiet " + " ".join(shlex.quote(p) for p in export.pip_packages),
            shlex.join(["python", fuse(script_uri), "local", f"--model-name={self.config.model.name}",
                        f"--state-dict-path={fuse(names.state_dict_uri)}"]),
        ])
        return aiplatform_v1.CustomJob(
            display_name=f"{names.prefix}-export",
            labels={"gpuflow-run": names.prefix},
            job_spec=aiplatform_v1.CustomJobSpec(
                worker_pool_specs=[aiplatform_v1.WorkerPoolSpec(
                    replica_count=1,
                    machine_spec=aiplatform_v1.MachineSpec(machine_type=machine),
                    disk_spec=aiplatform_v1.DiskSpec(boot_disk_type="pd-ssd", boot_disk_size_gb=disk_gb),
                    container_spec=aiplatform_v1.ContainerSpec(
                        image_uri=export.container_image, command=["bash", "-c"], args=[script]
                    ),
                )],
                service_account=self.config.dataflow.service_account or "",
            ),
        )

    def export_model(self, model_name: str, names: ResourceNames,
                     on_job: Callable[[JobHandle], None] | None = None) -> str:
        from google.cloud import aiplatform_v1

        script_uri = names.gcs_uri("code", "download_model.py")
        self._gcs().upload(names.bucket, script_uri.removeprefix(f"gs://{names.bucket}/"),
                           filename=str(beam_jobs_dir() / "download_model.py"))
        client = self.clients.vertex_jobs(self.config.region)
        parent = f"projects/{self.config.project}/locations/{self.config.region}"
        job = client.create_custom_job(request=aiplatform_v1.CreateCustomJobRequest(
            parent=parent, custom_job=self.custom_job(names, script_uri)))
        machine, disk_gb = self.export_machine()
        log.info("Vertex AI custom job %s started on %s (%d GB disk): exporting %s", job.name, machine, disk_gb,
                 model_name)
        if on_job:
            on_job(JobHandle(kind="vertex-custom-job", id=job.name, name=job.name, location=self.config.region,
                             url=vertex_custom_job_url(self.config.project, job.name)))
        started = time.monotonic()
        done = {aiplatform_v1.JobState.JOB_STATE_SUCCEEDED}
        failed = {aiplatform_v1.JobState.JOB_STATE_FAILED, aiplatform_v1.JobState.JOB_STATE_CANCELLED,
                  aiplatform_v1.JobState.JOB_STATE_EXPIRED}

        def finished() -> bool:
            current = client.get_custom_job(request=aiplatform_v1.GetCustomJobRequest(name=job.name))
            state = aiplatform_v1.JobState(current.state)
            if state in failed:
                raise VertexJobFailed(f"Vertex AI job {job.name} ended {state.name}: {current.error.message}. "
                                      "Fix: read the job's logs in the Vertex AI console; a larger "
                                      "export.machine_type helps when it ran out of memory.")
            log.info("export job %s: %s (%.0fs)", job.name, state.name, time.monotonic() - started)
            return state in done

        self._wait(f"Vertex AI job {job.name}", self.config.export.timeout_s, finished)
        return names.state_dict_uri

    def cancel_export(self, job_name: str) -> None:
        from google.cloud import aiplatform_v1

        self.clients.vertex_jobs(self.config.region).cancel_custom_job(
            request=aiplatform_v1.CancelCustomJobRequest(name=job_name))
        log.info("cancelled Vertex AI job %s", job_name)
