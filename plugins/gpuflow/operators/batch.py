"""The operators of llm_batch_inference that llm_streaming_inference does not have (the shared ones are imported
from ``gpuflow.operators.streaming``; ``gpuflow.steps.batch`` does the work)."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NoReturn

from airflow.providers.google.cloud.sensors.gcs import GCSObjectExistenceSensor
from airflow.sdk import Asset

from gpuflow.operators.airflow_names import (
    AirflowException,
    AirflowFailException,
    AirflowSensorTimeout,
)
from gpuflow.operators.base import GpuflowStepOperator, deferrable_or_site_default
from gpuflow.operators.run_config import trusted_config
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


class WaitForInputOperator(GCSObjectExistenceSensor):
    """Finds the interval's input (batch.input, a filled glob), with the provider's
    ``GCSObjectExistenceSensor(use_glob=True)``: none yet, it waits up to batch.input_wait_s (the sensor's
    ``timeout``), deferred or poking in its worker, every batch.input_poll_interval_s; still none,
    ``batch.missing_input: skip`` is the sensor's ``soft_fail`` (the run's other tasks are skipped), ``fail`` fails
    the run without a retry. gcp: objects in Cloud Storage, through the sensor's own poke. local: files in the
    storage emulator (the same poke) or on local disk (a glob).

    What gpuflow adds to the sensor: its arguments come from the validated configuration when the task runs
    (``configure``); deferred, it waits in ``gpuflow.triggers.batch_input``'s triggers (``defer``): on gcp the sensor's
    ``GCSBlobTrigger``, bounded (provider gap: it waits without end, and ``dag.test()`` enforces no deferral timeout),
    on the local profile one that finds the emulator, which the provider's async client finds only through the
    triggerer's environment.

    :param config_json: the validated configuration, ``BatchPreflightOperator``'s result (``preflight.output``).
    :param deferrable: the sensor's; None (the default): Airflow's ``[operators] default_deferrable``, read when the
        DAG is parsed.
    """

    template_fields: Sequence[str] = (*GCSObjectExistenceSensor.template_fields, "config_json")
    execution_timeout_from = "input"  # its execution_timeout: gpuflow.runs.task_timeouts
    ui_color = "#fff3cd"
    _config: GpuflowConfig | None = None
    _platform: Platform | None = None

    def __init__(self, *, config_json: Any, deferrable: bool | None = None, **kwargs: Any) -> None:
        super().__init__(bucket="", object="", use_glob=True, deferrable=deferrable_or_site_default(deferrable),
                         **kwargs)
        self.config_json = config_json

    def configure(self, context: Any) -> GpuflowConfig:
        """The sensor's arguments, from the trusted configuration."""
        from gpuflow.platform import get_platform

        config = self._config = trusted_config(self, self.config_json, context)
        platform = self._platform = get_platform(config)
        batch = config.batch
        self.bucket, _, self.object = batch.input.removeprefix("gs://").partition("/")
        identity = config.hook_identity(platform.conn_id)
        self.google_cloud_conn_id, self.impersonation_chain = identity["gcp_conn_id"], identity["impersonation_chain"]
        self.timeout, self.poke_interval = batch.input_wait_s, batch.input_poll_interval_s
        self.soft_fail = batch.missing_input == "skip"
        return config

    def execute(self, context: Any) -> Any:
        self.configure(context)
        return super().execute(context)

    def poke(self, context: Any) -> bool:
        config, platform = self._config, self._platform
        assert config is not None and platform is not None  # (execute configured them)
        with platform.environment():
            if config.batch.input.startswith("gs://"):
                found = super().poke(context)
            else:
                from gpuflow.steps.batch import find_input

                found = self._matches = bool(find_input(config, platform.conn_id))
        if not found:
            log.info("no file matches %s yet: waiting up to %.0fs (checking every %.0fs); then batch.missing_input "
                     "(%s)", config.batch.input, self.timeout, self.poke_interval, config.batch.missing_input)
        return found

    def defer(self, *, trigger: Any, method_name: str, kwargs: dict[str, Any] | None = None,
              timeout: Any = None) -> NoReturn:
        """The sensor's deferral, to the profile's bounded trigger (``gpuflow.triggers.batch_input``)."""
        from gpuflow.operators.base import deferral_timeout
        from gpuflow.triggers.batch_input import input_trigger

        assert self._config is not None  # (execute configured it)
        super().defer(trigger=input_trigger(self._config), method_name=method_name, kwargs=kwargs,
                      timeout=deferral_timeout(self.timeout))

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        """The trigger's event: a match, an error, or none within batch.input_wait_s (then soft_fail applies)."""
        config = self.configure(context)
        if event.get("status") == "timeout":
            fix = ("batch.missing_input is skip, so the run's other tasks are skipped" if self.soft_fail else
                   "Fix: put the interval's JSONL files there and clear this task, or set batch.missing_input: skip")
            raise AirflowSensorTimeout(f"no input for this interval: {event.get('message')}. {fix}")
        if event.get("status") == "error":
            raise AirflowException(f"waiting for {config.batch.input} failed: {event.get('message')}")
        return super().execute_complete(context, event)


class BatchSetupOperator(SetupResourcesOperator):
    """The run's bucket (for the exported model and the job's staging), without Pub/Sub: a batch job reads files.
    Through the provider's GCSHook on both profiles (local: the storage emulator). It waits for nothing."""

    takes_plain_arguments = False  # a gpuflow configuration only

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

    takes_plain_arguments = False  # a gpuflow configuration only

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

    takes_plain_arguments = False  # a gpuflow configuration only

    def delete_resources(self, context: Any, config: GpuflowConfig, names: ResourceNames, platform: Platform, stopped: list[str]) -> dict[str, Any]:
        from gpuflow.steps.batch import discard_staging
        from gpuflow.steps.cleanup import delete_run_resources

        return {**delete_run_resources(config, names, platform, stopped, pubsub=False),
                "staged_files_deleted": discard_staging(config, names, platform.conn_id)}
