"""The operators of dataproc_gpu_batch."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from gpuflow.operators.airflow_names import AirflowFailException
from gpuflow.operators.base import (
    GpuflowStepOperator,
    JobWaitingOperator,
    config_from_params,
    names_for,
    validated_config,
)
from gpuflow.operators.links import DataprocConsoleLink

if TYPE_CHECKING:
    from gpuflow.configuration.model import GpuflowConfig

log = logging.getLogger(__name__)


class DataprocPreflightOperator(BaseOperator):
    """The configuration's rules (the Dataproc ones included), on both profiles; local: Java for local Spark (the
    batch needs no emulator); gcp: the project's access. It waits for nothing."""

    execution_timeout_from = "short"  # its execution_timeout: gpuflow.runs.task_timeouts

    ui_color = "#fff3cd"

    def execute(self, context: Any) -> dict[str, Any]:
        return validated_config(self.derive_config(context), context, "dataproc", "the Dataproc batch")

    @staticmethod
    def derive_config(context: Any) -> GpuflowConfig:
        """The run's configuration, from the configuration file and the run's conf (``PreflightOperator``'s)."""
        config = config_from_params(context)
        if config.dataproc is None:
            raise AirflowFailException("the configuration has no dataproc section. Fix: use "
                                       "configs/dataproc.example.yaml or add a dataproc: section.")
        return config


class DataprocBatchOperator(JobWaitingOperator):
    """Runs the batch. local: Spark here, in the task (it waits for the Spark job in the worker). gcp: Dataproc
    Serverless, created with the provider's DataprocHook and waited for, deferred, by its DataprocBatchTrigger.
    ``on_kill``, and the trigger's while deferred, cancel it.

    Not the provider's ``DataprocCreateBatchOperator(deferrable=True)`` (apache-airflow-providers-google 22.8.0):
    - not for parse cost: the dag-processor imports a provider module a DAG file names once, before it forks each
      parse, and a one-task DAG with the create and delete operators parsed at 1.04 times a bare one-task DAG
      (benchmarks/dag_parse.py, docs/benchmarks.md); but running it nested inside this operator's ``execute`` is
      what Airflow's ExecutorSafeguard warns will become an error;
    - deferred, it waits with ``DataprocBatchTrigger``, which has no ``on_kill`` and no timeout, and its own
      ``on_kill`` cancels only the operation it still holds, which a deferred task no longer does;
    - its ``execute_complete`` returns nothing; the batch's result is its driver output (the executors' GPU count).
    What it does that matters is done here the same way, with its hook: a fixed batch id per run, and a retry that
    finds the batch there (``AlreadyExists``) waits for it instead of creating a second one.
    """

    execution_timeout_from = "dataproc_batch"  # its execution_timeout: gpuflow.runs.task_timeouts

    ui_color = "#d4edda"
    operator_extra_links = (DataprocConsoleLink(),)
    _config = None
    _operation_name = None

    def execute(self, context: Any) -> Any:
        from gpuflow.dataproc.serverless import batch_id_for
        from gpuflow.platform.console import dataproc_batch_url
        from gpuflow.steps.dataproc_batch import create_gcp_batch, run_local_batch
        from gpuflow.triggers.cancelling import CancellingDataprocBatchTrigger

        config = self._config = self.trusted_config(context)
        if not config.traits.managed_spark:
            return run_local_batch(config)
        batch_id = batch_id_for(names_for(context, config).prefix)
        dataproc = config.dataproc
        if dataproc is None:  # preflight's dataproc workflow refuses a configuration without it
            raise AirflowFailException("the configuration has no dataproc section. Fix: add one "
                                       "(configs/dataproc.example.yaml).")
        context["ti"].xcom_push(key=DataprocConsoleLink.source_key,
                                value=dataproc_batch_url(config.project, config.region, batch_id))
        self._operation_name = create_gcp_batch(config, batch_id, names_for(context, config).prefix,
                                                lease=(context["dag"].dag_id, context["run_id"]))
        if self._operation_name:
            context["ti"].xcom_push(key="operation", value=self._operation_name)
        log.info("deferring until Dataproc batch %s ends (up to %.0fs)", batch_id, dataproc.timeout_s)
        trigger = CancellingDataprocBatchTrigger(
            batch_id=batch_id, project_id=config.project, region=config.region, **config.hook_identity(),
            polling_interval_seconds=self.poll_interval if self.poll_interval is not None
            else dataproc.poll_interval_s,
            timeout_s=dataproc.timeout_s, cancel_on_kill=self.cancel_on_kill)
        return self.wait_for(context, trigger, dataproc.timeout_s)  # execute_complete gets its event

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> Any:
        from gpuflow.dataproc.serverless import batch_id_for
        from gpuflow.steps.dataproc_batch import BatchFailed, finished_gcp_batch

        config = self.trusted_config(context)
        event = event or {}
        batch_id = event.get("batch_id") or batch_id_for(names_for(context, config).prefix)
        state = event.get("batch_state") or event.get("status", "UNKNOWN")  # the timeout's event has no batch state
        try:
            return finished_gcp_batch(config, batch_id, state,
                                      event.get("batch_state_message") or event.get("message") or "")
        except BatchFailed as failure:
            raise AirflowFailException(str(failure)) from None  # the batch ended: a retry would find it ended

    def on_kill(self) -> None:
        from gpuflow.steps.dataproc_batch import cancel_gcp_batch

        if self.cancel_on_kill and self._config is not None and self._operation_name:
            log.info("task killed: cancelling %s", self._operation_name)
            cancel_gcp_batch(self._config, self._operation_name)


class DataprocCleanupOperator(GpuflowStepOperator):
    """gcp: deletes the run's batch on Dataproc ("not found" is fine); local: nothing, the local profile leaves
    nothing behind. It waits for nothing.

    The provider's ``DataprocDeleteBatchOperator`` (22.8.0) makes the same ``DataprocHook.delete_batch`` call, but it
    fails on a batch that is not there, which a teardown after a failed submit must accept."""

    execution_timeout_from = "every_region_stops"  # its execution_timeout: gpuflow.runs.task_timeouts

    ui_color = "#f8d7da"

    def execute(self, context: Any) -> Any:
        return self._delete_batch(context)

    def _delete_batch(self, context: Any) -> Any:
        from gpuflow.dataproc.serverless import batch_id_for
        from gpuflow.steps.dataproc_batch import delete_gcp_batch

        config = self.trusted_config(context)
        if not config.traits.managed_spark:
            log.info("local Spark batch: nothing to clean up")
            return {"deleted_batch": None}
        batch_id = batch_id_for(names_for(context, config).prefix)
        return {"deleted_batch": batch_id if delete_gcp_batch(config, batch_id) else None}
