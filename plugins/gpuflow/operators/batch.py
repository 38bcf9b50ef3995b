"""The operators of llm_batch_inference that llm_streaming_inference does not have (the shared ones are imported
from ``gpuflow.operators.streaming``; ``gpuflow.steps.batch`` does the work)."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from airflow.sdk import Asset

from gpuflow.operators.airflow_names import AirflowException, AirflowFailException, AirflowSkipException
from gpuflow.operators.base import GpuflowStepOperator, JobWaitingOperator
from gpuflow.operators.streaming import (
    CleanupOperator,
    GpuUsageCheck,
    LaunchPipelineOperator,
    PreflightOperator,
    SetupResourcesOperator,
    _handle_of,
)

if TYPE_CHECKING:
    from gpuflow.configuration.model import GpuflowConfig
    from gpuflow.platform import Platform
    from gpuflow.runs.naming import ResourceNames

log = logging.getLogger(__name__)

#: Updated by every publish: the answers of one date, whole. The event's extra is the run's summary (``ds``, the
#: answers and dead-letter files, the counts and rates). Downstream DAGs schedule on it (docs/batch.md).
BATCH_ANSWERS_ASSET = Asset(name="gpuflow_batch_answers")


class BatchPreflightOperator(PreflightOperator):
    """Preflight of the batch workflow (``PreflightOperator``, both profiles), with the interval's dates filled into
    batch.input, batch.output and batch.dead_letter_output. It waits for nothing."""

    workflow = "batch"

    def for_this_run(self, config: GpuflowConfig, context: Any) -> GpuflowConfig:
        from gpuflow.configuration.model import ConfigError
        from gpuflow.runs.batch_paths import date_fields, fill_batch_paths

        # A batch run is its own: deployment.mode (the streaming DAG's) does not apply to it.
        config = config.model_copy(update={"deployment": config.deployment.model_copy(update={"mode": "ephemeral"})})
        try:
            return fill_batch_paths(config, date_fields(context))
        except ConfigError as error:
            raise AirflowFailException(str(error)) from None


class WaitForInputOperator(JobWaitingOperator):
    """Finds the interval's input; when there is none yet, waits, deferred, up to batch.input_wait_s for it to
    appear. Still none: batch.missing_input skips the run's other tasks, or fails the run. local: files on local disk
    or in the storage emulator; gcp: objects in Cloud Storage.

    It waits with the trigger that ``GCSObjectExistenceSensor(use_glob=True, deferrable=True)`` defers to,
    ``GCSBlobTrigger`` (``gpuflow.triggers.batch_input``), not with the sensor (apache-airflow-providers-google
    22.8.0). Not for parse cost (named in a DAG file, the sensor parsed at 1.14 times a bare one-task DAG the way
    the dag-processor parses: docs/benchmarks.md), but because one task serves both profiles: on the local profile
    the input lies on local disk or in the storage emulator, which the provider's async client finds only through
    the triggerer's environment. (On gcp the sensor would do: it defers with its ``timeout``, and ``soft_fail`` turns
    the timeout into a skip, as ``batch.missing_input: skip`` does.)"""

    execution_timeout_from = "input"  # its execution_timeout: gpuflow.runs.task_timeouts

    ui_color = "#fff3cd"

    def execute_step(self, config: GpuflowConfig, names: ResourceNames, platform: Platform, context: Any) -> Any:
        from gpuflow.steps.batch import find_input

        files = find_input(config, platform.conn_id)
        if files:
            return {"input": config.batch.input, "files": files}
        if config.batch.input_wait_s > 0:
            from gpuflow.triggers.batch_input import input_trigger

            log.info("no file matches %s yet: waiting up to %.0fs (checking every %.0fs)", config.batch.input,
                     config.batch.input_wait_s, config.batch.input_poll_interval_s)
            return self.wait_for(context, input_trigger(config), config.batch.input_wait_s)
        return self._missing(config, f"{config.batch.input} matches no file")

    def execute_complete_step(self, config: GpuflowConfig, names: ResourceNames, platform: Platform, context: Any,
                              event: dict[str, Any]) -> Any:
        from gpuflow.steps.batch import find_input

        files = find_input(config, platform.conn_id)
        if files:
            return {"input": config.batch.input, "files": files}
        if event.get("status") == "error":
            raise AirflowException(f"waiting for the input failed: {event.get('message')}")
        return self._missing(config, event.get("message") or "no input")

    @staticmethod
    def _missing(config: GpuflowConfig, why: str) -> None:
        if config.batch.missing_input == "skip":
            raise AirflowSkipException(f"no input for this interval ({why}); batch.missing_input is skip, so the "
                                       "run's other tasks are skipped")
        raise AirflowFailException(f"no input for this interval: {why}. Fix: put the interval's JSONL files there "
                                   "and clear this task, or set batch.missing_input: skip")


class BatchSetupOperator(SetupResourcesOperator):
    """The run's bucket (for the exported model and the job's staging), without Pub/Sub: a batch job reads files.
    Through the provider's GCSHook on both profiles (local: the storage emulator). It waits for nothing."""

    def execute_step(self, config: GpuflowConfig, names: ResourceNames, platform: Platform, context: Any) -> Any:
        from gpuflow.steps.resources import create_resources

        return create_resources(config, names, platform.conn_id, pubsub=False,
                                lease=(context["dag"].dag_id, context["run_id"]))


class RunBatchOperator(LaunchPipelineOperator):
    """Starts the batch job on the interval's input (with the streaming launch's fallbacks on an exhausted zone)
    and waits until it is done: up to ``HOLD_S`` in its worker (a job done by then completes without deferring,
    ``gpuflow.triggers.settle``), then deferred. It writes into the run's staging folders, which publish moves into
    place. local: a pipeline process on the local runner; gcp: a batch Dataflow job. Not retried in gpuflow's DAGs
    (``retries=0``), as the launch."""

    execution_timeout_from = "batch_job"  # its execution_timeout: gpuflow.runs.task_timeouts

    batch = True


class PublishOutputsOperator(GpuflowStepOperator):
    """Checks that every input line ended answered or dead-lettered, then replaces the date's outputs with the
    run's; the summary (counts, prompts/s, tokens/s) goes to the log, XCom, ``_SUCCESS`` and the Asset event.
    local: files on local disk or in the storage emulator; gcp: Cloud Storage, through GCSHook. It waits for
    nothing.

    :param config_json: the validated configuration, ``BatchPreflightOperator``'s result (``preflight.output``).
    :param batch_job: the batch job and its window, ``RunBatchOperator``'s result (``run_batch.output``).
    """

    execution_timeout_from = "publish"  # its execution_timeout: gpuflow.runs.task_timeouts

    ui_color = "#d4edda"
    template_fields: Sequence[str] = ("config_json", "batch_job")

    def __init__(self, *, batch_job: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.batch_job = batch_job  # its window: the summary's rates

    def execute_step(self, config: GpuflowConfig, names: ResourceNames, platform: Platform, context: Any) -> Any:
        from gpuflow.steps.batch import CountsDoNotAddUp, publish_outputs, staged_summary

        started, ended = (self.batch_job or {}).get("window") or (0.0, 0.0)
        try:
            summary = staged_summary(config, names, platform.conn_id, ended - started)
        except CountsDoNotAddUp as error:
            raise AirflowFailException(str(error)) from None
        # A reprocessed date keeps its run id: when and at which try this output was published tell which is newer.
        ti = context["ti"]
        summary = {"ds": context.get("ds"), "run_id": context["run_id"],
                   "published_at": datetime.now(UTC).isoformat(timespec="seconds"),
                   "try_number": ti.try_number, **summary}
        log.info("batch summary:\n%s", json.dumps(summary, indent=2))
        publish_outputs(config, names, platform.conn_id, summary)
        context["outlet_events"][BATCH_ANSWERS_ASSET].extra = summary
        return summary


class BatchGpuUsageOperator(GpuUsageCheck):
    """After the batch job: did its GPUs work over the job's window (smoke_test.gpu_usage: fail, warn, ignore)?
    local: nvidia-smi; gcp: Cloud Monitoring, waited for deferred (``GpuUsageCheck``).

    :param config_json: the validated configuration, ``BatchPreflightOperator``'s result (``preflight.output``).
    :param batch_job: the batch job and its window, ``RunBatchOperator``'s result (``run_batch.output``).
    """

    template_fields: Sequence[str] = ("config_json", "batch_job")

    def __init__(self, *, batch_job: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.batch_job = batch_job

    def execute_step(self, config: GpuflowConfig, names: ResourceNames, platform: Platform, context: Any) -> Any:
        job = self.batch_job or {}
        handle = _handle_of(job.get("job"))
        return self.check_usage(context, config, platform, handle, job.get("window") or [0.0, 0.0],
                                {"job_id": handle.id if handle else None})


class BatchCleanupOperator(CleanupOperator):
    """Cleanup of a batch run (``CleanupOperator``, both profiles: it waits, deferred, while gcp's jobs stop): its
    bucket or prefix (it has no Pub/Sub), and its staging folders (left by a job or a publish that failed)."""

    def delete_resources(self, context: Any, config: GpuflowConfig, names: ResourceNames, platform: Platform, stopped: list[str]) -> dict[str, Any]:
        from gpuflow.steps.batch import discard_staging
        from gpuflow.steps.cleanup import delete_run_resources

        return {**delete_run_resources(config, names, platform, stopped, pubsub=False),
                "staged_files_deleted": discard_staging(config, names, platform.conn_id)}
