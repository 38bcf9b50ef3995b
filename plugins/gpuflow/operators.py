"""Thin Airflow operators over gpuflow.steps.

Importing this module is cheap: the steps, and through them torch, Beam and the Google clients,
are imported inside ``execute``, never when Airflow parses a DAG file.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from airflow.sdk import Asset, BaseOperator, BaseOperatorLink, Param
from airflow.sdk.exceptions import AirflowFailException

log = logging.getLogger(__name__)

#: The Params' JSON schemas, generated from the pydantic model (`gpuflow params-schema --write`; a test
#: keeps it current). Read from a file so that parsing a DAG never builds the pydantic schema.
PARAMS_SCHEMA_FILE = Path(__file__).with_name("params_schema.json")


#: Updated by every export_model run; the event's extra says where the bf16 state_dict lies
#: ({"state_dict_uri", "model_dir_uri", "model", "kept"}). Downstream DAGs schedule on it (README).
#: Named, without a URI scheme: a scheme makes Airflow load every provider to normalise it (a second per parse).
STATE_DICT_ASSET = Asset(name="gpuflow_state_dict")

#: Params every DAG shows; each DAG adds the sections it uses.
_COMMON_PARAMS = ("profile", "project", "region", "bucket", "gcp_conn_id")
#: The sections (Param key prefixes) of each DAG; None: every field except the Dataproc batch's.
DAG_SECTIONS: dict[str, tuple[str, ...] | None] = {
    "llm_streaming_inference": None,
    "gpu_quota_report": ("gpu__", "worker__max_num_workers"),
    "dataproc_gpu_batch": ("dataproc__",),
}


def dag_params(dag_id: str) -> dict[str, Param]:
    """One Param per configuration field the DAG uses, all empty by default (empty: the config file's value).

    Fewer Params parse faster: Airflow copies them into every task, and validates them for scheduled DAGs.
    """
    sections = DAG_SECTIONS[dag_id]
    default_file = "configs/dataproc.example.yaml" if dag_id == "dataproc_gpu_batch" else "configs/local.yaml"
    params = {
        "config_file": Param(
            default_file,
            type="string",
            title="config_file",
            description="YAML configuration, relative to the project root or absolute. The fields below override it.",
        )
    }
    for key, schema in json.loads(PARAMS_SCHEMA_FILE.read_text()).items():
        if sections is None:
            wanted = not key.startswith("dataproc__")
        else:
            wanted = key in _COMMON_PARAMS or key.startswith(sections)
        if wanted:
            params[key] = Param(None, **schema)
    return params


def config_from_params(context: Any):
    """The run's configuration: its config file, then its Params. A bad one fails the task without retries."""
    from gpuflow.config import ConfigError, load_config

    params = dict(context["params"])
    try:
        return load_config(params.get("config_file"), params)
    except ConfigError as error:
        raise AirflowFailException(str(error)) from None


def names_for(context: Any, config):
    from gpuflow.naming import resource_names, run_prefix

    return resource_names(config, run_prefix(context["dag"].dag_id, context["run_id"]))


class _XComUrlLink(BaseOperatorLink):
    """A console link the task pushed to XCom (a URL, or a job handle with its ``url``)."""

    name = ""
    source_key = ""

    def get_link(self, operator: BaseOperator, *, ti_key: Any) -> str:
        from airflow.sdk.bases.xcom import BaseXCom as XCom

        value = XCom.get_value(ti_key=ti_key, key=self.source_key)
        if isinstance(value, dict):
            value = value.get("url")
        return value if isinstance(value, str) and value.startswith("https://") else ""


class DataflowJobLink(_XComUrlLink):
    name = "Dataflow job"
    source_key = "job_handle"


class VertexAIJobLink(_XComUrlLink):
    name = "Vertex AI job"
    source_key = "vertex_job_url"


class CloudBuildLink(_XComUrlLink):
    name = "Cloud Build"
    source_key = "cloud_build_url"


class DataprocBatchLink(_XComUrlLink):
    name = "Dataproc batch"
    source_key = "dataproc_batch_url"


CONSOLE = "https://console.cloud.google.com"


class GpuflowStepOperator(BaseOperator):
    """Rebuilds the validated config from the preflight task's XCom and runs one step in the profile's environment."""

    template_fields = ("config_json", "image")
    ui_color = "#e8f4fd"

    # The one __init__ of all step operators, with the few step-specific arguments: Airflow deep-copies
    # the DAG's Params once per __init__ in the class chain, and every copy counts at DAG parse time.
    def __init__(self, *, config_json: Any = None, image: Any = None, launch_task_id: str = "launch", **kwargs: Any):
        super().__init__(**kwargs)
        self.config_json = config_json
        self.image = image  # verify_gpu: build_container's result
        self.launch_task_id = launch_task_id  # cleanup: where the job handle was pushed

    def execute(self, context: Any) -> Any:
        from gpuflow.config import config_from_json
        from gpuflow.platform import get_platform

        config = config_from_json(self.config_json)
        names = names_for(context, config)
        platform = get_platform(config)
        with platform.environment():
            return self.run_step(config, names, platform, context)

    def run_step(self, config, names, platform, context: Any) -> Any:
        raise NotImplementedError


class PreflightOperator(BaseOperator):
    """Validate the configuration and the environment; fail before anything is created."""

    ui_color = "#fff3cd"

    def execute(self, context: Any) -> dict[str, Any]:
        from gpuflow.preflight import PreflightFailed, format_findings, has_errors, run_preflight

        config = config_from_params(context)
        findings = run_preflight(config)
        log.info("preflight of run %s:\n%s", names_for(context, config).prefix, format_findings(findings))
        if has_errors(findings):
            # A bad configuration will not get better on retry.
            raise AirflowFailException(str(PreflightFailed(findings)))
        return config.model_dump(mode="json")


class GpuQuotaReportOperator(BaseOperator):
    """Reads GPU quota headroom (gcp) or local GPUs (local); warns when it is below what inference needs."""

    ui_color = "#fff3cd"

    def execute(self, context: Any) -> dict[str, Any]:
        from gpuflow.quota import format_quota, local_gpu_report, regional_gpu_quota, regions_client

        config = config_from_params(context)
        if config.profile == "local":
            report = local_gpu_report(config)
            if report["count"] == 0 and not report["torch_cuda_devices"]:
                log.warning("no GPU on this machine (%s); the local profile runs inference on CPU",
                            report.get("note", "nvidia-smi lists none"))
            else:
                log.info("local GPUs: %s", report["gpus"])
            return {"profile": "local", **report}
        readings = regional_gpu_quota(config, regions_client(config.gcp_conn_id))
        log.info("GPU quota for %s:\n%s", config.project, format_quota(readings))
        for reading in readings:
            if not reading.enough:
                log.warning(
                    "%s: %g %s free, but llm_streaming_inference needs %d (gpu.count x worker.max_num_workers). "
                    "Fix: request more quota or lower worker.max_num_workers.",
                    reading.region, reading.headroom, reading.metric, reading.needed,
                )
        return {"profile": "gcp", "readings": [r.as_dict() for r in readings]}


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

        def remember(job_name: str) -> None:
            self._remote_job = job_name
            _, _, location, _, job_id = job_name.split("/")[1:6]
            url = f"{CONSOLE}/vertex-ai/locations/{location}/training/{job_id}/cpu?project={config.project}"
            context["ti"].xcom_push(key=VertexAIJobLink.source_key, value=url)

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

        def remember(build_id: str) -> None:
            self._build_id = build_id
            url = f"{CONSOLE}/cloud-build/builds;region={config.region}/{build_id}?project={config.project}"
            context["ti"].xcom_push(key=CloudBuildLink.source_key, value=url)

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


# -- dataproc_gpu_batch -----------------------------------------------------------------------------


class DataprocPreflightOperator(BaseOperator):
    """The configuration's rules (the Dataproc ones included); the batch needs no emulator."""

    ui_color = "#fff3cd"

    def execute(self, context: Any) -> dict[str, Any]:
        from gpuflow.preflight import PreflightFailed, format_findings, has_errors, run_preflight

        config = config_from_params(context)
        if config.dataproc is None:
            raise AirflowFailException("the configuration has no dataproc section. Fix: use "
                                       "configs/dataproc.example.yaml or add a dataproc: section.")
        findings = run_preflight(config, workflow="dataproc")
        log.info("preflight of the Dataproc batch:\n%s", format_findings(findings))
        if has_errors(findings):
            raise AirflowFailException(str(PreflightFailed(findings)))
        return config.model_dump(mode="json")


class DataprocBatchOperator(GpuflowStepOperator):
    """Runs the batch (local Spark, or Dataproc Serverless); returns the job's result; ``on_kill`` cancels it."""

    ui_color = "#d4edda"
    operator_extra_links = (DataprocBatchLink(),)
    _config = None
    _operation_name = None

    def execute(self, context: Any) -> Any:
        from gpuflow.config import config_from_json
        from gpuflow.dataproc import batch_id_for
        from gpuflow.steps.dataproc_batch import BatchFailed, run_local_batch, submit_gcp_batch

        config = self._config = config_from_json(self.config_json)
        if config.profile == "local":
            return run_local_batch(config)
        prefix = names_for(context, config).prefix
        batch_url = f"{CONSOLE}/dataproc/batches/{config.region}/{batch_id_for(prefix)}/monitoring?project={config.project}"
        context["ti"].xcom_push(key=DataprocBatchLink.source_key, value=batch_url)

        def remember(operation) -> None:
            self._operation_name = operation.operation.name
            context["ti"].xcom_push(key="operation", value=self._operation_name)

        try:
            return submit_gcp_batch(config, batch_id_for(prefix), prefix, on_operation=remember)
        except BatchFailed as failure:
            raise AirflowFailException(str(failure)) from None  # the batch ended: a retry would find it ended

    def on_kill(self) -> None:
        from gpuflow.steps.dataproc_batch import cancel_gcp_batch

        if self._config is not None and self._operation_name:
            log.info("task killed: cancelling %s", self._operation_name)
            cancel_gcp_batch(self._config, self._operation_name)


class DataprocCleanupOperator(GpuflowStepOperator):
    """Deletes the run's batch on Dataproc ("not found" is fine); the local profile leaves nothing behind."""

    ui_color = "#f8d7da"

    def execute(self, context: Any) -> Any:
        from gpuflow.config import config_from_json
        from gpuflow.dataproc import batch_id_for
        from gpuflow.steps.dataproc_batch import delete_gcp_batch

        config = config_from_json(self.config_json)
        if config.profile == "local":
            log.info("local Spark batch: nothing to clean up")
            return {"deleted_batch": None}
        batch_id = batch_id_for(names_for(context, config).prefix)
        return {"deleted_batch": batch_id if delete_gcp_batch(config, batch_id) else None}
