"""The operators of llm_streaming_inference, one per step (gpuflow.steps does the work)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from airflow.sdk import Asset, BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from gpuflow.operators.base import (
    GpuflowStepOperator,
    config_from_params,
    names_for,
    validated_config,
)
from gpuflow.operators.links import CloudBuildLink, DataflowJobLink, VertexAIJobLink

if TYPE_CHECKING:  # gpuflow.platform is imported when a task runs, never when a DAG file is parsed
    from gpuflow.platform import JobHandle

log = logging.getLogger(__name__)

#: Updated by every export_model run; the event's extra says where the bf16 state_dict lies
#: ({"state_dict_uri", "model_dir_uri", "model", "kept"}). Downstream DAGs schedule on it (README).
#: Named, without a URI scheme: a scheme makes Airflow load every provider to normalise it (a second per parse).
STATE_DICT_ASSET = Asset(name="gpuflow_state_dict")


class PreflightOperator(BaseOperator):
    """Validate the configuration and the environment; fail before anything is created."""

    ui_color = "#fff3cd"

    def execute(self, context: Any) -> dict[str, Any]:
        config = config_from_params(context)
        zones_offering = None
        if config.profile == "gcp":  # the region check asks Compute Engine (the catalog's table is the fallback)
            from gpuflow.platform import get_platform

            zones_offering = get_platform(config).zones_offering
        return validated_config(config, context, "inference", f"run {names_for(context, config).prefix}", zones_offering)


class SetupResourcesOperator(GpuflowStepOperator):
    def run_step(self, config, names, platform, context):
        from gpuflow.steps.resources import create_resources

        return create_resources(config, names, platform.conn_id)


class QuotaCheckOperator(GpuflowStepOperator):
    """gcp: fail before anything is created when the regional GPU quota cannot cover the workers."""

    ui_color = "#fff3cd"

    def run_step(self, config, names, platform, context):
        from gpuflow.steps.quota import QuotaTooLow, check_quota

        try:
            return check_quota(config, platform)
        except QuotaTooLow as error:
            raise AirflowFailException(str(error)) from None  # quota does not grow on retry


class ExportModelOperator(GpuflowStepOperator):
    """Exports the bf16 state_dict (Vertex AI on gcp); ``on_kill`` cancels the Vertex AI job."""

    operator_extra_links = (VertexAIJobLink(),)
    _platform = None
    _remote_job = None

    def run_step(self, config, names, platform, context):
        from gpuflow.steps.export import export_model

        self._platform = platform

        def remember(job: JobHandle) -> None:
            self._remote_job = job.name
            context["ti"].xcom_push(key=VertexAIJobLink.source_key, value=job.url)

        result = export_model(config, names, platform, on_job=remember)
        context["outlet_events"][STATE_DICT_ASSET].extra = {
            "state_dict_uri": result["state_dict_uri"], "model_dir_uri": result["model_dir_uri"],
            "model": result["model"], "kept": bool(config.export.model_dir),
        }
        return result

    def on_kill(self) -> None:
        if self._platform is not None and self._remote_job:
            log.info("task killed: cancelling %s", self._remote_job)
            self._platform.cancel_export(self._remote_job)


class BuildContainerOperator(GpuflowStepOperator):
    """Renders and builds the worker image (Cloud Build on gcp); ``on_kill`` cancels the build."""

    operator_extra_links = (CloudBuildLink(),)
    _platform = None
    _build_id = None

    def run_step(self, config, names, platform, context):
        from gpuflow.steps.container import build_container

        self._platform = platform

        def remember(build: JobHandle) -> None:
            self._build_id = build.id
            context["ti"].xcom_push(key=CloudBuildLink.source_key, value=build.url)

        return build_container(config, names, platform, on_build=remember)

    def on_kill(self) -> None:
        if self._platform is not None and self._build_id:
            log.info("task killed: cancelling build %s", self._build_id)
            self._platform.cancel_build(self._build_id)


def _image_of(build_result: Any) -> str:
    """build_container's result (through XCom) or an image URI."""
    return (build_result.get("image") if isinstance(build_result, dict) else build_result) or ""


class VerifyGpuOperator(GpuflowStepOperator):
    def run_step(self, config, names, platform, context):
        from gpuflow.steps.gpu import NoGpuOnWorkers, verify_gpu

        try:
            return verify_gpu(config, names, platform, _image_of(self.image))
        except NoGpuOnWorkers as error:
            raise AirflowFailException(str(error)) from None


class LaunchPipelineOperator(GpuflowStepOperator):
    """Starts the streaming pipeline; pushes its job handle at once; ``on_kill`` stops it."""

    ui_color = "#d4edda"
    operator_extra_links = (DataflowJobLink(),)
    _platform = None
    _handle = None

    def run_step(self, config, names, platform, context):
        from gpuflow.steps.launch import launch

        self._platform = platform

        def remember(handle) -> None:
            self._handle = handle
            context["ti"].xcom_push(key=DataflowJobLink.source_key, value=handle.to_xcom())

        return launch(config, names, platform, _image_of(self.image), on_handle=remember).to_xcom()

    def on_kill(self) -> None:
        if self._platform is not None and self._handle is not None:
            log.info("task killed: stopping pipeline %s", self._handle.name)
            self._platform.stop_pipeline(self._handle)


def _pushed_handle(context: Any, launch_task_id: str):
    from gpuflow.platform import JobHandle

    pushed = context["ti"].xcom_pull(task_ids=launch_task_id, key=DataflowJobLink.source_key)
    return JobHandle.model_validate(pushed) if pushed else None


class SmokeTestOperator(GpuflowStepOperator):
    """Asks the pipeline questions; on gcp then checks that its GPUs really worked (Cloud Monitoring)."""

    def run_step(self, config, names, platform, context):
        from gpuflow.steps.smoke import NoGpuUsage, smoke_test

        try:
            return smoke_test(config, names, platform.conn_id, platform=platform,
                              handle=_pushed_handle(context, self.launch_task_id))
        except NoGpuUsage as error:
            raise AirflowFailException(str(error)) from None


class CleanupOperator(GpuflowStepOperator):
    """Stops the run's pipeline (by handle, and by the run's prefix) and deletes the run's resources."""

    ui_color = "#f8d7da"

    def run_step(self, config, names, platform, context):
        from gpuflow.steps.cleanup import cleanup

        return cleanup(config, names, platform, _pushed_handle(context, self.launch_task_id))
