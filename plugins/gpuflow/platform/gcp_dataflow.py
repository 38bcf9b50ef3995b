"""The gcp profile's Dataflow jobs: stage, start, stop and find them (their tasks wait in
``gpuflow.triggers.dataflow``, which reads what ``dataflow_watch`` judges).

Dataflow jobs are launched in two steps, both of them real on Google Cloud:
1. Beam's own DataflowRunner stages the job with ``--template_location``: it uploads the pipeline and
   writes the exact job request (environment, worker pool, service options, experiments) to GCS.
2. The Dataflow Templates API starts that request and answers at once with the job id, which the
   task pushes to XCom before it defers until the workers are up.

The launch, the job reads and the stops go through the provider's ``DataflowHook`` (``launch_job_with_template``,
``launch_job_with_flex_template``, ``get_job``, ``cancel_job``); the listing of active jobs and a job's labels through
its ``AsyncDataflowHook`` (``list_jobs`` with the ACTIVE filter, ``get_job`` with a job view; public methods of
apache-airflow-providers-google 22.8.0), run to completion here.

Because step 1 is Beam's own code, the request can be read back and checked offline (tests do, on the
GCS emulator), and the launch command can be printed for a person to run (`gpuflow launch-command`). Every launch
reads the request back and checks it against Dataflow's documented constraints (``gpuflow.dataflow.constraints``)
right before it is sent.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from typing import TYPE_CHECKING, Any

from gpuflow.configuration.loading import beam_jobs_dir
from gpuflow.dataflow.constraints import enforce
from gpuflow.dataflow.options import (
    flex_launch,
    job_name_for,
    runtime_environment,
    sdk_python_of,
    staging_variables,
    template_uri_for,
)
from gpuflow.dataflow.request import DataflowRequest, from_flex_launch, from_staged_job, with_template_launch
from gpuflow.dataflow.watch import TERMINAL_STATES
from gpuflow.images.containers import image_cuda
from gpuflow.platform.base import JobHandle
from gpuflow.platform.console import dataflow_job_url
from gpuflow.platform.gcp_service import GcpService
from gpuflow.runs.naming import ResourceNames

if TYPE_CHECKING:
    from airflow.providers.google.cloud.hooks.dataflow import AsyncDataflowHook, DataflowHook

log = logging.getLogger(__name__)


class DataflowJobFailed(RuntimeError):
    """A Dataflow job failed or could not start; the text carries Dataflow's own error messages."""


class DataflowJobs(GcpService):
    def stage_template(self, script: str, argv: list[str], names: ResourceNames, image: str, job_name: str,
                       streaming: bool) -> tuple[str, dict[str, Any]]:
        """Let Beam's DataflowRunner write the job request to GCS; return its URI and the request itself.

        The Beam provider's BeamHook runs the staging (the exact command `gpuflow launch-command` prints)."""
        from airflow.providers.apache.beam.hooks.beam import BeamHook
        from airflow.providers.common.compat.sdk import AirflowException

        template_uri = template_uri_for(names, job_name)
        variables = staging_variables(self.config, names, argv, image, job_name, streaming)
        chain = self.clients.impersonation_chain()
        if chain:  # Beam's own option: the staging acts as the same identity as gpuflow's other API calls
            variables["impersonate_service_account"] = ",".join(chain)
        log.info("staging %s with Beam's DataflowRunner (BeamHook)", job_name)
        with self.clients.credentials_for_subprocess():
            try:
                BeamHook(runner="DataflowRunner").start_python_pipeline(
                    variables=variables, py_file=str(beam_jobs_dir() / script), py_options=[],
                    py_interpreter=sys.executable)
            except AirflowException as failure:
                raise DataflowJobFailed(f"staging {job_name} failed ({failure}); Beam's output is in the task log "
                                        "above. Fix: run `gpuflow launch-command` to repeat it by hand.") from None
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

    def staged_request(self, template: dict[str, Any]) -> DataflowRequest:
        """The staged job as Dataflow receives it, with the resource hints of its pipeline proto (read from GCS)."""
        pipeline_url = template.get("environment", {}).get("sdkPipelineOptions", {}).get("options", {}).get(
            "pipelineUrl")
        proto = None
        if pipeline_url:
            bucket, _, blob = pipeline_url.removeprefix("gs://").partition("/")
            proto = self._gcs().download(bucket, blob)
        return from_staged_job(template, proto, image_cuda(self.config))

    def _dataflow_hook(self, drain: bool = False, wait: bool = False) -> DataflowHook:
        """The provider's DataflowHook. ``wait``: its cancel_job waits until the stop has ended (cancel_timeout,
        polling every poll_sleep); without it the hook only asks, and the cleanup task waits in its trigger."""
        from airflow.providers.google.cloud.hooks.dataflow import DataflowHook

        dataflow = self.config.dataflow
        return DataflowHook(**self.config.hook_identity(self.conn_id), drain_pipeline=drain,
                            cancel_timeout=max(1, round(dataflow.stop_timeout_s)) if wait else None,
                            poll_sleep=dataflow.poll_interval_s)  # type: ignore[arg-type] # seconds, a float

    def start_template(self, template_uri: str, template: dict[str, Any], job_name: str, names: ResourceNames,
                       streaming: bool) -> JobHandle:
        """Start the Beam-staged request with the provider's DataflowHook.launch_job_with_template (no waiting), once
        the request (the staged job with the launch's environment) passes Dataflow's documented constraints."""
        from google.cloud import dataflow_v1beta3

        runtime = runtime_environment(self.config, names, streaming)
        enforce(with_template_launch(self.staged_request(template), runtime))
        environment = dataflow_v1beta3.RuntimeEnvironment.to_dict(runtime, preserving_proto_field_name=False)
        job = self._dataflow_hook().launch_job_with_template(
            job_name=job_name, variables={}, parameters={}, dataflow_template=template_uri, append_job_name=False,
            project_id=self.config.project, location=self.config.region, environment=environment)
        handle = self._handle(job["id"], job_name, self.config.region)
        log.info("Dataflow job %s started: %s", handle.id, handle.url)
        return handle

    def _handle(self, job_id: str, job_name: str, region: str) -> JobHandle:
        return JobHandle(kind="dataflow", id=job_id, name=job_name, location=region,
                         url=dataflow_job_url(self.config.project, region, job_id))

    def start_flex_template(self, job: str, argv: list[str], names: ResourceNames, image: str,
                            job_name: str, streaming: bool, update: dict[str, str] | None = None) -> JobHandle:
        """launch.mode flex_template: write the template file, then launch it with the provider's
        DataflowHook.launch_job_with_flex_template; the image pickles its own job. ``update`` (a transform name
        mapping): replace the running job ``job_name`` in place, with the update fields in the same body."""
        from google.cloud import dataflow_v1beta3

        spec, request = flex_launch(self.config, names, job, argv, image, job_name, streaming)
        enforce(from_flex_launch(request.launch_parameter, image_cuda(self.config)))
        spec_uri = request.launch_parameter.container_spec_gcs_path
        self._gcs().upload(names.bucket, spec_uri.removeprefix(f"gs://{names.bucket}/"),
                           data=json.dumps(spec, indent=2), mime_type="application/json")
        if update is not None:
            request.launch_parameter.update = True
            request.launch_parameter.transform_name_mappings = update
        body = {"launchParameter": dataflow_v1beta3.LaunchFlexTemplateParameter.to_dict(
            request.launch_parameter, preserving_proto_field_name=False)}
        launched = self._dataflow_hook().launch_job_with_flex_template(
            body=body, location=request.location, project_id=request.project_id)
        handle = self._handle(launched["id"], job_name, self.config.region)
        log.info("Dataflow job %s started from the Flex Template %s: %s", handle.id, spec_uri, handle.url)
        return handle

    def start_job(self, script: str, argv: list[str], names: ResourceNames, image: str, job_name: str,
                  streaming: bool) -> JobHandle:
        """Stage with Airflow's Beam and start (direct), or start as a Flex Template from the image itself."""
        if self.config.launch_mode == "flex_template":
            return self.start_flex_template(script.removesuffix(".py"), argv, names, image, job_name, streaming)
        template_uri, template = self.stage_template(script, argv, names, image, job_name, streaming)
        return self.start_template(template_uri, template, job_name, names, streaming)

    def launch_pipeline(self, argv: list[str], names: ResourceNames, image: str = "",
                        streaming: bool = True, kind: str = "") -> JobHandle:
        job_name = job_name_for(names, self.config, kind or ("llm-inference" if streaming else "llm-batch"))
        return self.start_job("llm_inference.py", argv, names, image, job_name, streaming=streaming)

    def update_pipeline(self, argv: list[str], names: ResourceNames, image: str, job_name: str,
                        transform_name_mapping: dict[str, str]) -> JobHandle:
        """Dataflow's update: a replacement job under the running job's name, with the transform name mapping.

        Direct launch: Beam stages the new request as usual, and the Templates API launches it with
        ``update: true`` ("Update a custom template streaming job"). Provider gap (apache-airflow-providers-google
        22.8.0): DataflowHook.launch_job_with_template takes no ``update`` nor ``transformNameMapping``, so the same
        ``templates.launch`` request goes through the hook's own client (``get_conn()``) with them.
        Flex Templates: the provider's launch_job_with_flex_template takes the whole body, update fields included."""
        from google.cloud import dataflow_v1beta3

        if self.config.launch_mode == "flex_template":
            handle = self.start_flex_template("llm_inference", argv, names, image, job_name, streaming=True,
                                              update=transform_name_mapping)
        else:
            template_uri, template = self.stage_template("llm_inference.py", argv, names, image, job_name,
                                                         streaming=True)
            runtime = runtime_environment(self.config, names, streaming=True)
            enforce(with_template_launch(self.staged_request(template), runtime))
            parameters = dataflow_v1beta3.LaunchTemplateParameters(
                job_name=job_name, update=True, transform_name_mapping=transform_name_mapping, environment=runtime)
            body = dataflow_v1beta3.LaunchTemplateParameters.to_dict(parameters, preserving_proto_field_name=False)
            response = self._dataflow_hook().get_conn().projects().locations().templates().launch(
                projectId=self.config.project, location=self.config.region, gcsPath=template_uri, body=body,
            ).execute(num_retries=5)
            handle = self._handle(response["job"]["id"], job_name, self.config.region)
        log.info("Dataflow job %s updated in place by %s: %s", job_name, handle.id, handle.url)
        return handle

    def _job_state(self, handle: JobHandle) -> str:
        """The job's state name (``JOB_STATE_RUNNING`` …), read with the provider's DataflowHook."""
        job = self._dataflow_hook().get_job(job_id=handle.id, project_id=self.config.project,
                                            location=handle.location)
        return str(job.get("currentState", "JOB_STATE_UNKNOWN"))

    def job_timeout_s(self, until: str) -> float:
        dataflow = self.config.dataflow
        return dataflow.stop_timeout_s if until == "stopped" else dataflow.start_timeout_s

    def job_running(self, handle: JobHandle) -> bool:
        from googleapiclient.errors import HttpError

        try:
            return self._job_state(handle) not in TERMINAL_STATES
        except HttpError as error:
            if error.resp.status == 404:
                return False
            raise

    def request_stop(self, handle: JobHandle, drain: bool | None = None) -> bool:
        """Ask for a cancel or a drain (``drain``, else dataflow.stop_action) with the provider's
        DataflowHook.cancel_job, without waiting; True if the job was still active."""
        return self._stop(handle, drain, wait=False)

    def stop_pipeline(self, handle: JobHandle) -> bool:
        """Stop the job and wait until it has (dataflow.stop_timeout_s), both in the provider's
        DataflowHook(cancel_timeout=…).cancel_job: for on_kill and a start that failed. The cleanup task requests
        its stops and defers instead."""
        return self._stop(handle, None, wait=True)

    def _stop(self, handle: JobHandle, drain: bool | None, wait: bool) -> bool:
        from airflow.exceptions import AirflowException  # type: ignore[attr-defined]
        from googleapiclient.errors import HttpError

        try:
            state = self._job_state(handle)
        except HttpError as error:
            if error.resp.status == 404:
                return False
            raise
        if state in TERMINAL_STATES:
            log.info("Dataflow job %s is already %s", handle.id, state)
            return False
        # The hook drains streaming jobs only; one not yet running can only be cancelled.
        wanted = self.config.dataflow.stop_action == "drain" if drain is None else drain
        drain = wanted and state == "JOB_STATE_RUNNING"
        log.info("requesting the %s of Dataflow job %s (%s)%s", "drain" if drain else "cancellation", handle.id,
                 handle.name, " and waiting for it" if wait else "")
        try:
            self._dataflow_hook(drain=drain, wait=wait).cancel_job(job_id=handle.id, project_id=self.config.project,
                                                                   location=handle.location)
        except AirflowException as error:  # its cancel_timeout passed, or the job ended another way while it waited
            log.warning("Dataflow job %s: the stop was asked for, and did not end as a stop within %.0fs: %s",
                        handle.id, self.config.dataflow.stop_timeout_s, error)
        return True

    def job_labels(self, handle: JobHandle) -> dict[str, str]:
        """A job's labels: Dataflow lists jobs as summaries, without labels, so each is read with GetJob in
        JOB_VIEW_DESCRIPTION ("summary info and limited job description data for steps, labels and environment",
        docs.cloud.google.com/dataflow/docs/reference/rest/v1b3/JobView)."""
        from google.cloud import dataflow_v1beta3

        job = asyncio.run(self._async_hook().get_job(
            job_id=handle.id, project_id=self.config.project, location=handle.location,
            job_view=dataflow_v1beta3.JobView.JOB_VIEW_DESCRIPTION))
        return dict(job.labels)

    def find_run_jobs(self, names: ResourceNames) -> list[JobHandle]:
        """Active jobs whose name carries the run's prefix, in the region and every fallback region."""
        return self._active_jobs((names.prefix + "-", names.job_prefix + "-"))

    def find_gpuflow_jobs(self) -> list[JobHandle]:
        """Every active gpuflow job (named gf-… by a run, gfd-… by a deployment): the janitor's view."""
        return self._active_jobs(("gf-", "gfd-"))

    def _active_jobs(self, name_prefixes: tuple[str, ...]) -> list[JobHandle]:
        from google.cloud import dataflow_v1beta3

        from gpuflow.gpus.quota import quota_regions

        async def active(region: str) -> list[Any]:
            pager = await self._async_hook().list_jobs(jobs_filter=dataflow_v1beta3.ListJobsRequest.Filter.ACTIVE,
                                                       project_id=self.config.project, location=region)
            return [job async for job in pager]

        return [self._handle(job.id, job.name, region) for region in quota_regions(self.config)
                for job in asyncio.run(active(region)) if job.name.startswith(name_prefixes)]

    def _async_hook(self) -> AsyncDataflowHook:
        from airflow.providers.google.cloud.hooks.dataflow import AsyncDataflowHook

        return AsyncDataflowHook(**self.config.hook_identity(self.conn_id))
