"""The dataproc_gpu_batch workflow: run the PySpark batch locally (local Spark) or on Dataproc Serverless (gcp)."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuflow.configuration.model import DataprocConfig, GpuflowConfig
from gpuflow.paths import project_path

if TYPE_CHECKING:
    from airflow.providers.google.cloud.hooks.dataproc import DataprocHook

log = logging.getLogger(__name__)

RESULT_MARKER = "GPUFLOW_RESULT "


class BatchFailed(RuntimeError):
    pass


def parse_result(output: str) -> dict[str, Any]:
    """The job's ``GPUFLOW_RESULT {...}`` line; its absence is an error that says where to look."""
    for line in reversed(output.splitlines()):
        if RESULT_MARKER in line:
            result: dict[str, Any] = json.loads(line.split(RESULT_MARKER, 1)[1])
            return result
    raise BatchFailed("the batch finished without printing its GPUFLOW_RESULT line; read its driver output")


def batch_settings(config: GpuflowConfig) -> DataprocConfig:
    """The configuration's dataproc section, which the dataproc workflow's preflight requires."""
    if config.dataproc is None:
        raise BatchFailed("the configuration has no dataproc section. Fix: add one (configs/dataproc.example.yaml).")
    return config.dataproc


def main_file(config: GpuflowConfig) -> Path:
    path = Path(batch_settings(config).main_python_file)
    return path if path.is_absolute() else project_path(str(path))


# -- local profile: the same PySpark file on local Spark ---------------------------------------------


def run_local_batch(config: GpuflowConfig) -> dict[str, Any]:
    """Local Spark with one thread group per executor; a machine without nvidia-smi reports 0 GPUs."""
    import os

    from gpuflow.platform.processes import run_logged

    batch = batch_settings(config)
    threads = batch.executor_instances * batch.local_threads
    submit_args = (f"--master local[{threads}] --conf spark.executor.instances={batch.executor_instances} "
                   "--conf spark.ui.enabled=false pyspark-shell")
    env = {**os.environ, "PYSPARK_SUBMIT_ARGS": submit_args, "PYTHONUNBUFFERED": "1"}
    output = run_logged([sys.executable, str(main_file(config)), *batch.args], env, "local Spark batch",
                        timeout_s=batch.timeout_s)
    result = parse_result(output)
    for note in result.get("notes", []):
        log.warning("%s", note)
    log.info("local Spark batch: %d GPU(s) on the executors, join of %d rows", result["accelerator_count"],
             result["joined_rows"])
    return result


# -- gcp profile: Dataproc Serverless through the provider's hook ------------------------------------


def _hook(config: GpuflowConfig) -> DataprocHook:
    from airflow.providers.google.cloud.hooks.dataproc import DataprocHook

    return DataprocHook(**config.hook_identity())


def staged_main_file_uri(config: GpuflowConfig, prefix: str, lease: tuple[str, str] | None = None) -> str:
    """gs:// files are used as they are; a project file is uploaded to the bucket under the run's prefix, after the
    run's lease (``lease``: dag_id, run_id), so that gpuflow_janitor leaves it alone while the run runs."""
    main_python_file = batch_settings(config).main_python_file
    if main_python_file.startswith("gs://"):
        return main_python_file
    if not config.bucket:
        raise BatchFailed("a local main_python_file needs a bucket to stage it. Fix: set bucket, or a gs:// file.")
    from airflow.providers.google.cloud.hooks.gcs import GCSHook

    if lease:
        from gpuflow.platform.records import Records
        from gpuflow.runs.naming import resource_names

        Records(config, config.gcp_conn_id).write_lease(resource_names(config, prefix), *lease)
    object_name = f"gpuflow/{prefix}/spark_jobs/{main_file(config).name}"
    GCSHook(**config.hook_identity()).upload(config.bucket, object_name, filename=str(main_file(config)))
    return f"gs://{config.bucket}/{object_name}"


def read_driver_output(config: GpuflowConfig, output_uri: str) -> str:
    """Dataproc writes the driver's output to ``<output_uri>.NNNNNNNNN`` objects in GCS."""
    from airflow.providers.google.cloud.hooks.gcs import GCSHook

    gcs = GCSHook(**config.hook_identity())
    bucket, _, prefix = output_uri.removeprefix("gs://").partition("/")
    return "".join(gcs.download(bucket, name).decode("utf-8", errors="replace")
                   for name in sorted(gcs.list(bucket, prefix=prefix)))


def failure_message(batch_id: str, state: str, state_message: str) -> str:
    """A batch that did not succeed: its state and message, with the cause and fix when the message is a known one."""
    from gpuflow.gpus.troubleshoot import classify

    diagnosis = classify(state_message)
    advice = f" Cause: {diagnosis.cause}. Fix: {diagnosis.fix}" if diagnosis else ""
    return f"batch {batch_id} ended {state}: {state_message}.{advice}"


def batch_result(config: GpuflowConfig, batch_id: str, output_uri: str) -> dict[str, Any]:
    """The succeeded batch's ``GPUFLOW_RESULT``, from its driver output."""
    result = parse_result(read_driver_output(config, output_uri))
    log.info("Dataproc batch %s: %d GPU(s) on the executors", batch_id, result["accelerator_count"])
    return result


def delete_gcp_batch(config: GpuflowConfig, batch_id: str) -> bool:
    """True if a batch was deleted; a batch that is not there is fine."""
    from google.api_core.exceptions import NotFound

    try:
        _hook(config).delete_batch(batch_id=batch_id, region=config.region, project_id=config.project)
    except NotFound:
        log.info("batch %s is not there (never created, or deleted already)", batch_id)
        return False
    log.info("deleted batch %s", batch_id)
    return True
