"""The gcp profile: Vertex AI export, Cloud Build image, Dataflow jobs, Compute Engine quota.

Dataflow jobs are launched in two steps, both of them real on Google Cloud:
1. Beam's own DataflowRunner stages the job with ``--template_location``: it uploads the pipeline and
   writes the exact job request (environment, worker pool, service options, experiments) to GCS.
2. The Dataflow Templates API starts that request and answers at once with the job id, which the
   task pushes to XCom before it waits for the workers.

Because step 1 is Beam's own code, the request can be read back and checked offline (tests do, on the
GCS emulator), and the launch command can be printed for a person to run (`gpuflow launch-command`).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuflow import catalog
from gpuflow.config import GpuflowConfig, beam_jobs_dir
from gpuflow.naming import ResourceNames
from gpuflow.platform.base import ImageBuildResult, JobHandle
from gpuflow.platform.console import cloud_build_url, dataflow_job_url, vertex_custom_job_url
from gpuflow.platform.gcp_clients import GcpClients

log = logging.getLogger(__name__)

#: Job messages that say the worker pool is up: "Workers have started successfully." and "All workers have
#: finished the startup processes and began to receive work requests." Some service versions write them at
#: JOB_MESSAGE_DETAILED importance, so they are read at DETAILED and above; the autoscaling events' worker
#: count (as Google's Dataflow samples read it) is the other sign that workers are up.
WORKERS_STARTED = re.compile(r"Workers have started successfully|All workers have finished the startup processes",
                             re.I)


class DataflowJobFailed(RuntimeError):
    """A Dataflow job failed or could not start; the text carries Dataflow's own error messages."""


class VertexJobFailed(RuntimeError):
    pass


class CloudBuildFailed(RuntimeError):
    pass


# -- the Dataflow options, as pure functions (the CLI prints them) ----------------------------------------------


def service_options(config: GpuflowConfig) -> list[str]:
    """The configured service options, plus how the GPU is asked for.

    worker_accelerator: gpuflow's option unless one was written by hand. resource_hint: Dataflow Prime
    (``enable_prime``) and no worker_accelerator at all; the hint sits on the RunInference step.
    """
    from gpuflow.gpu_options import PREFIX, worker_accelerator

    options = list(config.dataflow_service_options)
    if config.gpu.request == "resource_hint":
        return options if "enable_prime" in options else [*options, "enable_prime"]
    if not any(option.startswith(PREFIX) for option in options):
        options.append(worker_accelerator(config))
    return options


def experiments(config: GpuflowConfig) -> list[str]:
    from gpuflow.gpu_options import effective_sharing

    chosen = ["use_runner_v2", *config.dataflow.experiments]
    if effective_sharing(config) == "single_process" and "no_use_multiple_sdk_containers" not in chosen:
        chosen.append("no_use_multiple_sdk_containers")
    return chosen


def job_name_for(names: ResourceNames, config: GpuflowConfig, kind: str) -> str:
    """Unique per GPU placement, so a fallback never collides with the job it replaces."""
    gpu = config.gpu.type.removeprefix("nvidia-").removeprefix("tesla-")
    return f"{names.prefix}-{kind}-{config.region}-{gpu}"[:63].rstrip("-")


def template_uri_for(names: ResourceNames, job_name: str) -> str:
    return names.gcs_uri("templates", f"{job_name}.json")


def dataflow_options(config: GpuflowConfig, names: ResourceNames, image: str, job_name: str,
                     streaming: bool, template_uri: str | None) -> list[str]:
    """Every DataflowRunner option of a gpuflow job: Runner v2, the GPU, the image, the worker pool."""
    options = [
        "--runner=DataflowRunner",
        f"--project={config.project}",
        f"--region={config.region}",
        f"--job_name={job_name}",
        f"--temp_location={names.gcs_uri('tmp')}",
        f"--staging_location={names.gcs_uri('staging')}",
        f"--sdk_container_image={image}",
        "--sdk_location=container",
        f"--machine_type={config.gpu.machine_type}",
        f"--disk_size_gb={config.worker.disk_size_gb}",
        f"--max_num_workers={config.worker.max_num_workers}",
        *(f"--experiments={experiment}" for experiment in experiments(config)),
        *(f"--dataflow_service_options={option}" for option in service_options(config)),
        f"--labels=gpuflow-run={names.prefix}",
    ]
    if streaming:
        options.append("--streaming")
        if config.gpu.request == "resource_hint":
            # Right fitting supports streaming only with horizontal autoscaling, which Streaming Engine gives.
            options.append("--enable_streaming_engine")
    if config.dataflow.service_account:
        options.append(f"--service_account_email={config.dataflow.service_account}")
    if config.dataflow.network:
        options.append(f"--network={config.dataflow.network}")
    if config.dataflow.subnetwork:
        options.append(f"--subnetwork={config.dataflow.subnetwork}")
    if config.gpu.zone:
        options.append(f"--worker_zone={config.gpu.zone}")
    if template_uri:
        options.append(f"--template_location={template_uri}")
    return options


def staging_command(config: GpuflowConfig, names: ResourceNames, script: str, argv: list[str], image: str,
                    job_name: str, streaming: bool) -> list[str]:
    """The command that lets Beam's DataflowRunner write a job's request to GCS (it starts nothing)."""
    template_uri = template_uri_for(names, job_name)
    return [sys.executable, str(beam_jobs_dir() / script), *argv,
            *dataflow_options(config, names, image, job_name, streaming, template_uri)]


def gpu_metric_filter(metric_type: str, job_id: str) -> str:
    """A Cloud Monitoring filter for one Dataflow job's GPU metric.

    Dataflow's job GPU metrics (guide 000's "GPU utilization" and "GPU memory utilization" under resource type
    "Dataflow Job") are written on the monitored resource ``dataflow_job`` with the job id as the *metric*
    label ``job_id`` (docs.cloud.google.com/monitoring/api/metrics_gcp_d_h, section dataflow).
    """
    return f'metric.type = "{metric_type}" AND resource.type = "dataflow_job" AND metric.labels.job_id = "{job_id}"'


def runtime_environment(config: GpuflowConfig, names: ResourceNames):
    """The launch-time environment: the same worker pool as the staged request, stated again at launch."""
    from google.cloud import dataflow_v1beta3

    return dataflow_v1beta3.RuntimeEnvironment(**worker_pool_fields(config, names))


def worker_pool_fields(config: GpuflowConfig, names: ResourceNames) -> dict[str, Any]:
    """The fields a classic and a Flex Template launch both state about the workers."""
    return {
        "max_workers": config.worker.max_num_workers,
        "machine_type": config.gpu.machine_type,
        "disk_size_gb": config.worker.disk_size_gb,
        "temp_location": names.gcs_uri("tmp"),
        "service_account_email": config.dataflow.service_account or "",
        "network": config.dataflow.network or "",
        "subnetwork": config.dataflow.subnetwork or "",
        "worker_zone": config.gpu.zone or "",
        "additional_experiments": experiments(config),
        "additional_user_labels": {"gpuflow-run": names.prefix},
    }


def flex_parameters(job: str, argv: list[str], config: GpuflowConfig) -> dict[str, str]:
    """A gpuflow job's arguments as Flex Template parameters: ``--max-new-tokens 16`` -> max_new_tokens=16.

    The launcher passes each back as ``--max_new_tokens=16``; bare flags become ``true``."""
    parameters = {"gpuflow_job": job}
    tokens = list(argv)
    while tokens:
        name = tokens.pop(0).removeprefix("--").replace("-", "_")
        value = tokens.pop(0) if tokens and not tokens[0].startswith("--") else "true"
        parameters[name] = value
    parameters["dataflow_service_options"] = ",".join(service_options(config))
    return parameters


def flex_template_spec(image: str, parameter_names: list[str]) -> dict[str, Any]:
    """The Flex Template file: the image that launches (and runs) the job, and the parameters it takes."""
    return {
        "image": image,
        "sdkInfo": {"language": "PYTHON"},
        "metadata": {
            "name": "gpuflow",
            "description": "gpuflow's Beam jobs (llm_inference, gpu_check), launched from their own worker image",
            "parameters": [{"name": name, "label": name, "helpText": f"gpuflow job argument {name}",
                            "isOptional": name != "gpuflow_job"} for name in parameter_names],
        },
    }


def flex_runtime_environment(config: GpuflowConfig, names: ResourceNames, image: str):
    from google.cloud import dataflow_v1beta3

    return dataflow_v1beta3.FlexTemplateRuntimeEnvironment(
        **worker_pool_fields(config, names), staging_location=names.gcs_uri("staging"), sdk_container_image=image)


def flex_launch(config: GpuflowConfig, names: ResourceNames, job: str, argv: list[str], image: str,
                job_name: str) -> tuple[dict[str, Any], Any]:
    """The Flex Template file and the LaunchFlexTemplateRequest that starts it (the CLI prints the request)."""
    from google.cloud import dataflow_v1beta3

    parameters = flex_parameters(job, argv, config)
    request = dataflow_v1beta3.LaunchFlexTemplateRequest(
        project_id=config.project, location=config.region,
        launch_parameter=dataflow_v1beta3.LaunchFlexTemplateParameter(
            job_name=job_name, container_spec_gcs_path=names.gcs_uri("templates", f"{job_name}.flex.json"),
            parameters=parameters, environment=flex_runtime_environment(config, names, image)),
    )
    return flex_template_spec(image, sorted(parameters)), request


def sdk_python_of(template: dict[str, Any]) -> str | None:
    """The launcher's Python minor version, as Beam wrote it into the job request ("Apache Beam Python 3.11 SDK")."""
    agent = template.get("environment", {}).get("userAgent", {}).get("name", "")
    found = re.search(r"Python (\d+\.\d+)", agent)
    return found.group(1) if found else None


# -- the platform ------------------------------------------------------------------------------------------------


class GcpPlatform:
    def __init__(self, config: GpuflowConfig, clients: GcpClients | None = None):
        self.config = config
        self.conn_id = config.gcp_conn_id
        self.clients = clients or GcpClients(self.conn_id)

    def environment(self):
        # The provider's hooks read the Airflow connection; nothing has to be set in this process.
        return contextlib.nullcontext({})

    def _gcs(self):
        from airflow.providers.google.cloud.hooks.gcs import GCSHook

        return GCSHook(gcp_conn_id=self.conn_id)

    def _wait(self, what: str, timeout_s: float, poll: Callable[[], bool]) -> None:
        """Call ``poll`` until it returns True; it raises on failure and logs its own progress."""
        deadline = time.monotonic() + timeout_s
        while not poll():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} did not finish within {timeout_s:.0f}s")
            time.sleep(self.config.dataflow.poll_interval_s)

    # -- export: a Vertex AI custom job -------------------------------------------------------------------------

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

    # -- image: Cloud Build into Artifact Registry ---------------------------------------------------------------

    def image_exists(self, image: str) -> bool:
        """True when the Artifact Registry tag exists; images elsewhere are never assumed to exist."""
        from google.api_core.exceptions import NotFound
        from google.cloud import artifactregistry_v1

        found = re.fullmatch(r"([a-z0-9-]+)-docker\.pkg\.dev/([^/]+)/([^/]+)/(.+):([^:/]+)", image)
        if not found:
            return False
        location, project, repository, package, tag = found.groups()
        name = (f"projects/{project}/locations/{location}/repositories/{repository}/packages/"
                f"{package.replace('/', '%2F')}/tags/{tag}")
        try:
            self.clients.artifact_registry().get_tag(request=artifactregistry_v1.GetTagRequest(name=name))
            return True
        except NotFound:
            return False

    def cloud_build_request(self, source_object: str, image: str, bucket: str):
        from google.cloud.devtools import cloudbuild_v1
        from google.protobuf import duration_pb2

        return cloudbuild_v1.Build(
            source=cloudbuild_v1.Source(storage_source=cloudbuild_v1.StorageSource(bucket=bucket, object_=source_object)),
            steps=[cloudbuild_v1.BuildStep(name="gcr.io/cloud-builders/docker", args=["build", "-t", image, "."])],
            images=[image],
            timeout=duration_pb2.Duration(seconds=self.config.container.build_timeout_s),
            options=cloudbuild_v1.BuildOptions(
                machine_type=cloudbuild_v1.BuildOptions.MachineType.E2_HIGHCPU_8, disk_size_gb=200,
                logging=cloudbuild_v1.BuildOptions.LoggingMode.CLOUD_LOGGING_ONLY,
            ),
            tags=["gpuflow", self.config.container.recipe],
        )

    def build_image(self, context_dir: Path, image: str, names: ResourceNames,
                    on_build: Callable[[JobHandle], None] | None = None) -> ImageBuildResult:
        from google.cloud.devtools import cloudbuild_v1

        if self.image_exists(image):
            return ImageBuildResult(image=image, built=False, context_dir=str(context_dir),
                                    detail="already in Artifact Registry (same build context); build skipped")
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w:gz") as tar:
            tar.add(context_dir, arcname=".")
        source_object = f"{names.object_prefix}/build/context.tar.gz"
        self._gcs().upload(names.bucket, source_object, data=archive.getvalue(), mime_type="application/gzip")
        client = self.clients.cloud_build(self.config.region)
        operation = client.create_build(request=cloudbuild_v1.CreateBuildRequest(
            project_id=self.config.project, parent=f"projects/{self.config.project}/locations/{self.config.region}",
            build=self.cloud_build_request(source_object, image, names.bucket)))
        build_id = operation.metadata.build.id
        build_name = f"projects/{self.config.project}/locations/{self.config.region}/builds/{build_id}"
        log.info("Cloud Build %s started for %s (%d KB context)", build_id, image, len(archive.getvalue()) // 1024)
        if on_build:
            on_build(JobHandle(kind="cloud-build", id=build_id, name=build_name, location=self.config.region,
                               url=cloud_build_url(self.config.project, self.config.region, build_id)))
        started = time.monotonic()
        status = cloudbuild_v1.Build.Status

        def finished() -> bool:
            build = client.get_build(request=cloudbuild_v1.GetBuildRequest(
                name=build_name, project_id=self.config.project, id=build_id))
            state = status(build.status)
            if state in (status.FAILURE, status.INTERNAL_ERROR, status.TIMEOUT, status.CANCELLED, status.EXPIRED):
                raise CloudBuildFailed(f"Cloud Build {build_id} ended {state.name}: {build.status_detail}. "
                                       f"Fix: read its log at {build.log_url or 'the Cloud Build console'}.")
            log.info("build %s: %s (%.0fs)", build_id, state.name, time.monotonic() - started)
            return state == status.SUCCESS

        self._wait(f"Cloud Build {build_id}", self.config.container.build_timeout_s, finished)
        return ImageBuildResult(image=image, built=True, context_dir=str(context_dir),
                                detail=f"built by Cloud Build {build_id}")

    def cancel_build(self, build_id: str) -> None:
        from google.cloud.devtools import cloudbuild_v1

        self.clients.cloud_build(self.config.region).cancel_build(request=cloudbuild_v1.CancelBuildRequest(
            name=f"projects/{self.config.project}/locations/{self.config.region}/builds/{build_id}",
            project_id=self.config.project, id=build_id))
        log.info("cancelled Cloud Build %s", build_id)

    # -- Dataflow jobs -------------------------------------------------------------------------------------------

    def stage_template(self, script: str, argv: list[str], names: ResourceNames, image: str, job_name: str,
                       streaming: bool) -> tuple[str, dict[str, Any]]:
        """Let Beam's DataflowRunner write the job request to GCS; return its URI and the request itself."""
        from gpuflow.platform.local import run_logged

        template_uri = template_uri_for(names, job_name)
        command = staging_command(self.config, names, script, argv, image, job_name, streaming)
        with self.clients.credentials_for_subprocess():
            run_logged(command, {**os.environ, "PYTHONUNBUFFERED": "1"}, f"staging {job_name} with Beam's DataflowRunner")
        bucket, _, blob = template_uri.removeprefix("gs://").partition("/")
        template = json.loads(self._gcs().download(bucket, blob))
        launcher_python = sdk_python_of(template)
        if launcher_python and launcher_python != self.config.python_version:
            raise DataflowJobFailed(
                f"the job was staged by Python {launcher_python} but the container runs Python "
                f"{self.config.python_version}: the workers would fail with 'unknown opcode'. Fix: set python_version "
                f"to {launcher_python} (and rebuild the image), or launch from a Python {self.config.python_version}."
            )
        return template_uri, template

    def start_template(self, template_uri: str, job_name: str, names: ResourceNames) -> JobHandle:
        from google.cloud import dataflow_v1beta3

        response = self.clients.dataflow_templates().launch_template(request=dataflow_v1beta3.LaunchTemplateRequest(
            project_id=self.config.project, location=self.config.region, gcs_path=template_uri,
            launch_parameters=dataflow_v1beta3.LaunchTemplateParameters(
                job_name=job_name, environment=runtime_environment(self.config, names)),
        ))
        handle = self._handle(response.job.id, job_name, self.config.region)
        log.info("Dataflow job %s started: %s", handle.id, handle.url)
        return handle

    def _handle(self, job_id: str, job_name: str, region: str) -> JobHandle:
        return JobHandle(kind="dataflow", id=job_id, name=job_name, location=region,
                         url=dataflow_job_url(self.config.project, region, job_id))

    def start_flex_template(self, job: str, argv: list[str], names: ResourceNames, image: str,
                            job_name: str) -> JobHandle:
        """launch.mode flex_template: write the template file, then launch it; the image pickles its own job."""
        spec, request = flex_launch(self.config, names, job, argv, image, job_name)
        spec_uri = request.launch_parameter.container_spec_gcs_path
        self._gcs().upload(names.bucket, spec_uri.removeprefix(f"gs://{names.bucket}/"),
                           data=json.dumps(spec, indent=2), mime_type="application/json")
        response = self.clients.dataflow_flex_templates().launch_flex_template(request=request)
        handle = self._handle(response.job.id, job_name, self.config.region)
        log.info("Dataflow job %s started from the Flex Template %s: %s", handle.id, spec_uri, handle.url)
        return handle

    def start_job(self, script: str, argv: list[str], names: ResourceNames, image: str, job_name: str,
                  streaming: bool) -> JobHandle:
        """Stage with Airflow's Beam and start (direct), or start as a Flex Template from the image itself."""
        if self.config.launch.mode == "flex_template":
            return self.start_flex_template(script.removesuffix(".py"), argv, names, image, job_name)
        template_uri, _ = self.stage_template(script, argv, names, image, job_name, streaming)
        return self.start_template(template_uri, job_name, names)

    def launch_pipeline(self, argv: list[str], names: ResourceNames, image: str = "") -> JobHandle:
        job_name = job_name_for(names, self.config, "llm-inference")
        return self.start_job("llm_inference.py", argv, names, image, job_name, streaming=True)

    def _job_state(self, handle: JobHandle):
        from google.cloud import dataflow_v1beta3

        job = self.clients.dataflow_jobs().get_job(request=dataflow_v1beta3.GetJobRequest(
            project_id=self.config.project, location=handle.location, job_id=handle.id,
            view=dataflow_v1beta3.JobView.JOB_VIEW_SUMMARY))
        return dataflow_v1beta3.JobState(job.current_state)

    def _new_messages(self, handle: JobHandle, seen: set[str]) -> tuple[list[Any], int]:
        """The job's messages not seen before (DETAILED and above), and its current worker count from the
        latest autoscaling event (0 before any)."""
        from google.cloud import dataflow_v1beta3

        pager = self.clients.dataflow_messages().list_job_messages(request=dataflow_v1beta3.ListJobMessagesRequest(
            project_id=self.config.project, location=handle.location, job_id=handle.id,
            minimum_importance=dataflow_v1beta3.JobMessageImportance.JOB_MESSAGE_DETAILED))
        messages: list[Any] = []
        events: list[Any] = []
        for page in pager.pages:
            messages += page.job_messages
            events += page.autoscaling_events
        fresh = [m for m in messages if m.id not in seen]
        seen.update(m.id for m in fresh)
        latest = max(events, key=lambda event: event.time, default=None)
        return fresh, latest.current_num_workers if latest is not None else 0

    def wait_for_job(self, handle: JobHandle, until: str) -> None:
        """Wait until the job runs with its workers up (``running``) or has finished (``done``).

        Dataflow keeps a job RUNNING while it retries a zone with no free GPUs, so errors in the job's
        messages are read too: one that a fallback can fix (ZONE_RESOURCE_POOL_EXHAUSTED) ends the wait at once.
        """
        from google.cloud import dataflow_v1beta3

        from gpuflow.troubleshoot import classify

        states = dataflow_v1beta3.JobState
        failed = {states.JOB_STATE_FAILED, states.JOB_STATE_CANCELLED, states.JOB_STATE_DRAINED,
                  states.JOB_STATE_STOPPED, states.JOB_STATE_UPDATED}
        seen: set[str] = set()
        errors: list[str] = []
        workers_started = False
        started = time.monotonic()

        def diagnosis_text() -> str:
            diagnosis = classify("\n".join(errors))
            return f" Cause: {diagnosis.cause}. Fix: {diagnosis.fix}." if diagnosis else ""

        def reached() -> bool:
            nonlocal workers_started
            state = self._job_state(handle)
            messages, current_workers = self._new_messages(handle, seen)
            if current_workers > 0 and not workers_started:
                log.info("  autoscaling: %d worker(s) running", current_workers)
                workers_started = True
            for message in messages:
                importance = dataflow_v1beta3.JobMessageImportance(message.message_importance)
                log.log(logging.DEBUG if importance == importance.JOB_MESSAGE_DETAILED else logging.INFO,
                        "  [%s] %s", importance.name, message.message_text)
                if WORKERS_STARTED.search(message.message_text):
                    workers_started = True
                if message.message_importance == dataflow_v1beta3.JobMessageImportance.JOB_MESSAGE_ERROR:
                    errors.append(message.message_text)
                    diagnosis = classify(message.message_text)
                    if diagnosis and diagnosis.try_fallback:
                        raise DataflowJobFailed(f"Dataflow job {handle.id}: {message.message_text}{diagnosis_text()}")
            if state in failed:
                raise DataflowJobFailed(f"Dataflow job {handle.id} ended {state.name}: "
                                        f"{' | '.join(errors) or 'no error message'}.{diagnosis_text()}")
            if until == "done" and state == states.JOB_STATE_DONE:
                return True
            if until == "running" and state == states.JOB_STATE_RUNNING and workers_started:
                log.info("Dataflow job %s is running and its workers have started (%.0fs)", handle.id,
                         time.monotonic() - started)
                return True
            log.info("Dataflow job %s: %s, %s (%.0fs)", handle.id, state.name,
                     "workers started" if workers_started else "waiting for GPU workers", time.monotonic() - started)
            return False

        try:
            self._wait(f"Dataflow job {handle.id}", self.config.dataflow.start_timeout_s, reached)
        except TimeoutError:
            if not workers_started:
                errors.append("no worker activity has been seen")
            raise DataflowJobFailed(
                f"Dataflow job {handle.id} did not reach {until} within {self.config.dataflow.start_timeout_s:.0f}s "
                f"({' | '.join(errors) or 'workers started'}).{diagnosis_text() or ' Fix: read the job logs.'}"
            ) from None

    def wait_until_running(self, handle: JobHandle) -> None:
        self.wait_for_job(handle, "running")

    def stop_pipeline(self, handle: JobHandle) -> bool:
        """Cancel or drain (dataflow.stop_action); True if the job was still active."""
        from google.api_core.exceptions import NotFound
        from google.cloud import dataflow_v1beta3

        states = dataflow_v1beta3.JobState
        try:
            state = self._job_state(handle)
        except NotFound:
            return False
        terminal = {states.JOB_STATE_DONE, states.JOB_STATE_FAILED, states.JOB_STATE_CANCELLED,
                    states.JOB_STATE_DRAINED, states.JOB_STATE_UPDATED, states.JOB_STATE_STOPPED}
        if state in terminal:
            log.info("Dataflow job %s is already %s", handle.id, state.name)
            return False
        # A streaming job can drain; a batch job (or one not yet running) can only be cancelled.
        drain = self.config.dataflow.stop_action == "drain" and state == states.JOB_STATE_RUNNING
        requested = states.JOB_STATE_DRAINED if drain else states.JOB_STATE_CANCELLED
        self.clients.dataflow_jobs().update_job(request=dataflow_v1beta3.UpdateJobRequest(
            project_id=self.config.project, location=handle.location, job_id=handle.id,
            job=dataflow_v1beta3.Job(requested_state=requested)))
        log.info("requested %s of Dataflow job %s (%s)", requested.name, handle.id, handle.name)

        def stopped() -> bool:
            current = self._job_state(handle)
            log.info("Dataflow job %s: %s", handle.id, current.name)
            return current in terminal

        try:
            self._wait(f"stopping Dataflow job {handle.id}", self.config.dataflow.stop_timeout_s, stopped)
        except TimeoutError:
            log.warning("Dataflow job %s has not stopped within %.0fs; it is still being %s", handle.id,
                        self.config.dataflow.stop_timeout_s, "drained" if drain else "cancelled")
        return True

    def find_run_jobs(self, names: ResourceNames) -> list[JobHandle]:
        """Active jobs whose name carries the run's prefix, in the region and every fallback region."""
        from google.cloud import dataflow_v1beta3

        from gpuflow.quota import quota_regions

        handles = []
        for region in quota_regions(self.config):
            jobs = self.clients.dataflow_jobs().list_jobs(request=dataflow_v1beta3.ListJobsRequest(
                project_id=self.config.project, location=region, filter=dataflow_v1beta3.ListJobsRequest.Filter.ACTIVE))
            for job in jobs:
                if job.name.startswith(names.prefix + "-"):
                    handles.append(self._handle(job.id, job.name, region))
        return handles

    # -- GPU check and quota -------------------------------------------------------------------------------------

    def run_gpu_check(self, names: ResourceNames, image: str) -> dict[str, Any]:
        """beam_jobs/gpu_check.py as a batch Dataflow job on the GPU workers; its report comes back through GCS."""
        report_uri = names.gcs_uri("gpu-check", "report.json")
        argv = ["--report", report_uri]
        if self.config.require_gpu:
            argv.append("--require-gpu")
        job_name = job_name_for(names, self.config, "gpu-check")
        handle = self.start_job("gpu_check.py", argv, names, image, job_name, streaming=False)
        try:
            self.wait_for_job(handle, "done")
        except BaseException:
            self.stop_pipeline(handle)
            raise
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

    def gpu_capacity(self) -> dict[str, Any]:
        """The region's GPU quota and the project-wide GPUS_ALL_REGIONS; ``enough`` is False only when a quota
        is known to be too small (an unknown one is reported with its fix)."""
        from gpuflow.quota import gpu_quota

        readings = gpu_quota(self.config, self.clients.compute_regions(), self.clients.compute_projects(),
                             regions=[self.config.region])
        return {"source": "compute-quota", "readings": [r.as_dict() for r in readings],
                "enough": all(r.enough is not False for r in readings)}
