"""The gcp profile's export: a Vertex AI custom job runs download_model.py with Cloud Storage under /gcs/."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from gpuflow import catalog
from gpuflow.configuration.loading import beam_jobs_dir
from gpuflow.images.containers import EXPORT_LOCK
from gpuflow.images.locks import lock_path
from gpuflow.platform.base import JobHandle
from gpuflow.platform.console import vertex_custom_job_url
from gpuflow.platform.gcp_service import GcpService
from gpuflow.runs.naming import ResourceNames

if TYPE_CHECKING:
    from airflow.providers.google.cloud.hooks.vertex_ai.custom_job import CustomJobHook
    from google.cloud import aiplatform_v1

log = logging.getLogger(__name__)


class VertexExport(GcpService):
    def export_machine(self) -> tuple[str, int]:
        """The guide's machine and boot disk for the model size, unless the configuration sets them."""
        architecture = "causal" if self.config.model.architecture == "causal" else "seq2seq"
        size = catalog.model_size(self.config.model.name) or catalog.export_size_for(
            self.config.model.parameters_m or 0, architecture)
        return (self.config.export.machine_type or size.export_machine,
                self.config.export.boot_disk_size_gb or size.export_disk_gb)

    def custom_job(self, names: ResourceNames, script_uri: str, lock_uri: str) -> aiplatform_v1.CustomJob:
        """The Vertex AI CustomJob that installs export.lock on the image's own torch, then runs download_model.py
        with Cloud Storage mounted under /gcs/."""
        import shlex

        from google.cloud import aiplatform_v1

        def fuse(uri: str) -> str:
            return "/gcs/" + uri.removeprefix("gs://")

        machine, disk_gb = self.export_machine()
        export = self.config.export
        script = " && ".join([
            # --no-deps: the lock holds every dependency but torch, which the image brings (export.in says why).
            f"pip install --quiet --no-deps --require-hashes -r {shlex.quote(fuse(lock_uri))}",
            *(["pip install --quiet " + " ".join(shlex.quote(p) for p in export.pip_packages)]
              if export.pip_packages else []),
            "pip check",
            shlex.join(["python", fuse(script_uri), "local", f"--model-name={self.config.model.name}",
                        f"--state-dict-path={fuse(names.state_dict_uri)}",
                        *(["--save-pretrained"] if self.config.inference.engine == "vllm" else [])]),
        ])
        return aiplatform_v1.CustomJob(
            display_name=f"{names.prefix}-export",
            labels=names.labels,
            job_spec=aiplatform_v1.CustomJobSpec(
                worker_pool_specs=[aiplatform_v1.WorkerPoolSpec(
                    replica_count=1,
                    machine_spec=aiplatform_v1.MachineSpec(machine_type=machine),
                    disk_spec=aiplatform_v1.DiskSpec(boot_disk_type="pd-ssd", boot_disk_size_gb=disk_gb),
                    container_spec=aiplatform_v1.ContainerSpec(
                        image_uri=export.container_image, command=["bash", "-c"], args=[script]
                    ),
                )],
                service_account=self.export_account(),
            ),
        )

    def export_account(self) -> str:
        """The account the export runs as: always one gpuflow names, the workers' (dataflow.service_account, else
        Compute Engine's default account), the one preflight's access check verifies (its bucket roles, and the
        caller's actAs on it). Left unset, Vertex AI would run the job as its Custom Code Service Agent
        (service-PROJECT_NUMBER@gcp-sa-aiplatform-cc.iam.gserviceaccount.com: Vertex AI "Use a custom service
        account", cloud.google.com/vertex-ai/docs/general/custom-service-account), whose access to the bucket no
        check of gpuflow's reads. The project's number comes from Resource Manager (resourcemanager.projects.get,
        which setup's bucket check already needs)."""
        if self.config.dataflow.service_account:
            return self.config.dataflow.service_account
        project = self.clients.projects().get_project(request={"name": f"projects/{self.config.project}"})
        return f"{str(project.name).split('/', 1)[1]}-compute@developer.gserviceaccount.com"

    def export_model(self, model_name: str, names: ResourceNames) -> JobHandle:
        """Upload download_model.py and create the custom job with the provider's CustomJobHook; the task defers
        to the provider's CustomJobTrigger (``gpuflow.triggers.cancelling``) until it ends."""
        script_uri = names.gcs_uri("code", "download_model.py")
        lock_uri = names.gcs_uri("code", "export.lock")
        for uri, source in ((script_uri, beam_jobs_dir() / "download_model.py"), (lock_uri, lock_path(EXPORT_LOCK))):
            self._gcs().upload(names.bucket, uri.removeprefix(f"gs://{names.bucket}/"), filename=str(source))
        job = self._vertex_hook().create_custom_job(project_id=self.config.project, region=self.config.region,
                                             custom_job=self.custom_job(names, script_uri, lock_uri))
        machine, disk_gb = self.export_machine()
        log.info("Vertex AI custom job %s started on %s (%d GB disk): exporting %s", job.name, machine, disk_gb,
                 model_name)
        return self._export_handle(job.name)

    def _export_handle(self, job_name: str) -> JobHandle:
        return JobHandle(kind="vertex-custom-job", id=job_name.rsplit("/", 1)[-1], name=job_name,
                         location=self.config.region, url=vertex_custom_job_url(self.config.project, job_name))

    def find_export(self, names: ResourceNames) -> JobHandle | None:
        """A custom job of this run's name, with its ``gpuflow-run`` label, still queued, pending or running. Vertex
        AI's list filter takes ``display_name="..."`` (ListCustomJobsRequest.filter: "display_name supports =, !=
        comparisons", cloud.google.com/vertex-ai/docs/reference/rest/v1/projects.locations.customJobs/list)."""
        from google.cloud import aiplatform_v1

        waiting = {aiplatform_v1.JobState.JOB_STATE_QUEUED, aiplatform_v1.JobState.JOB_STATE_PENDING,
                   aiplatform_v1.JobState.JOB_STATE_RUNNING}
        jobs = self._vertex_hook().list_custom_jobs(
            project_id=self.config.project, region=self.config.region, page_size=None, page_token=None,
            filter=f'display_name="{names.prefix}-export"', read_mask=None)
        for job in jobs:
            if job.state in waiting and job.labels.get("gpuflow-run") == names.labels["gpuflow-run"]:
                return self._export_handle(job.name)
        return None

    def _vertex_hook(self) -> CustomJobHook:
        from airflow.providers.google.cloud.hooks.vertex_ai.custom_job import CustomJobHook

        return CustomJobHook(**self.config.hook_identity(self.conn_id))

    def cancel_export(self, job_name: str) -> None:
        self._vertex_hook().cancel_custom_job(project_id=self.config.project, region=self.config.region,
                                       custom_job=job_name.rsplit("/", 1)[-1])
        log.info("cancelled Vertex AI job %s", job_name)
