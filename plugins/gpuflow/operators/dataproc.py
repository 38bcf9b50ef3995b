"""The operators of dataproc_gpu_batch. Its batch task is the provider's DataprocCreateBatchOperator, extended: the
DAG file names the provider's module, so that the dag-processor imports it once, before it forks each parse."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any, NoReturn

from airflow.providers.google.cloud.hooks.dataproc import DataprocHook
from airflow.providers.google.cloud.operators.dataproc import DataprocCreateBatchOperator
from airflow.sdk import BaseOperator

from gpuflow.operators.airflow_names import AirflowFailException
from gpuflow.operators.base import (
    GpuflowStepOperator,
    deferrable_or_site_default,
    deferral_timeout,
    names_for,
    validated_config,
)
from gpuflow.operators.run_config import DerivesRunConfig, trusted_config

if TYPE_CHECKING:
    from gpuflow.configuration.model import GpuflowConfig

log = logging.getLogger(__name__)

#: The default bound on a batch's run, without a configuration (a day).
DAY_S = 24 * 3600.0


class DataprocPreflightOperator(DerivesRunConfig, BaseOperator):
    """The configuration's rules (the Dataproc ones included), on both profiles; local: Java for local Spark (the
    batch needs no emulator); gcp: the project's access. It waits for nothing."""

    workflow = "dataproc"
    execution_timeout_from = "short"  # its execution_timeout: gpuflow.runs.task_timeouts

    ui_color = "#fff3cd"

    def execute(self, context: Any) -> dict[str, Any]:
        return validated_config(self.derive_config(context), context, "dataproc", "the Dataproc batch")


class PacedDataprocHook(DataprocHook):
    """The provider's DataprocHook, whose synchronous batch wait polls at the operator's polling interval.

    Provider gap (tests/unit/test_provider_gaps.py): ``DataprocCreateBatchOperator`` waiting in its worker
    (``deferrable=False``) calls ``wait_for_batch`` without a ``wait_check_interval``, so it polls every 10 s whatever
    its ``polling_interval_seconds`` says."""

    def __init__(self, *, wait_check_interval: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.wait_check_interval = wait_check_interval

    def wait_for_batch(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("wait_check_interval", self.wait_check_interval)
        return super().wait_for_batch(*args, **kwargs)


class DataprocBatchOperator(DataprocCreateBatchOperator):
    """The provider's ``DataprocCreateBatchOperator``, with what a GPU batch needs that it lacks
    (apache-airflow-providers-google 22.8.0 and Composer's 22.2.0; tests/unit/test_provider_gaps.py):

    - ``on_kill`` cancels the batch by its id, also when this try found it there (a retry: ``AlreadyExists``); the
      provider's cancels only the operation its own create returned. Deferred, ``CancellingDataprocBatchTrigger``
      waits instead of ``DataprocBatchTrigger``: it cancels the batch when the task is killed, and when the batch
      outlasts ``batch_timeout_s`` (``defer``). Waiting in the worker, the polls follow ``polling_interval_seconds``
      (``PacedDataprocHook``), and the task's ``execution_timeout`` ends the wait (Airflow then calls ``on_kill``).
    - A batch that did not succeed fails the task without a retry (a retry would find it ended), with the failure's
      cause and fix (``gpuflow.gpus.troubleshoot``).

    Given ``config_json`` (gpuflow's DAG: ``preflight.output``), the provider's arguments come from the validated
    configuration when the task runs. gcp: the project, region, connection and impersonation chain, a batch id fixed
    for the run, the batch request (the GPU properties, the main file staged under the run's prefix, the run's label
    for the janitor), ``dataproc.poll_interval_s`` and ``dataproc.timeout_s``; the task's result is the batch's own
    (``GPUFLOW_RESULT``, from the driver output: the executors' GPU count). local: the same PySpark file runs on
    local Spark, in the task, which waits for it. Without ``config_json``, a team's DAG passes the provider's
    arguments (``region``, ``batch``, ``batch_id``, ``project_id``, …) as it would to the provider's operator.

    :param config_json: the validated configuration, ``DataprocPreflightOperator``'s result (``preflight.output``).
    :param region: the provider's; with config_json, the configuration's.
    :param batch: the provider's; with config_json, built from the configuration's dataproc section.
    :param batch_timeout_s: cancel the batch, and fail, when it runs longer (deferred; default a day); with
        config_json, ``dataproc.timeout_s``.
    :param cancel_on_kill: cancel the batch when the task is killed (the default), deferred or not.
    :param deferrable: the provider's; None (the default): Airflow's ``[operators] default_deferrable``, read when
        the DAG is parsed.
    :param polling_interval_seconds: the provider's; None: ``dataproc.poll_interval_s`` with config_json, else 5.
    """

    template_fields: Sequence[str] = (*DataprocCreateBatchOperator.template_fields, "config_json")
    execution_timeout_from = "dataproc_batch"  # its execution_timeout: gpuflow.runs.task_timeouts
    ui_color = "#d4edda"

    def __init__(self, *, config_json: Any = None, region: str | None = None,
                 batch: dict[str, Any] | Any | None = None, batch_timeout_s: float = DAY_S,
                 cancel_on_kill: bool = True, deferrable: bool | None = None,
                 polling_interval_seconds: float | None = None, **kwargs: Any) -> None:
        super().__init__(region=region or "", batch={} if batch is None else batch,
                         deferrable=deferrable_or_site_default(deferrable),
                         # (the provider annotates int seconds; its waits sleep any number of them)
                         polling_interval_seconds=polling_interval_seconds or 5,  # type: ignore[arg-type]
                         **kwargs)
        plain = [name for name, value in (("region", region), ("batch", batch)) if value]
        if config_json is not None and plain:
            raise TypeError(f"DataprocBatchOperator (task {self.task_id}) takes config_json (a gpuflow configuration) "
                            f"or the provider's arguments, not both: {', '.join(plain)} given beside it")
        if config_json is None and len(plain) < 2:
            raise TypeError(f"DataprocBatchOperator (task {self.task_id}) needs config_json (a gpuflow configuration) "
                            "or the provider's region and batch")
        self.config_json, self.batch_timeout_s, self.cancel_on_kill = config_json, batch_timeout_s, cancel_on_kill
        self.polling_from_config = polling_interval_seconds is None

    def configure(self, context: Any) -> GpuflowConfig | None:
        """With config_json: set the provider's arguments from the trusted configuration, and return it."""
        if self.config_json is None:
            return None
        from gpuflow.dataproc.serverless import batch_id_for
        from gpuflow.steps.dataproc_batch import batch_settings

        config = trusted_config(self, self.config_json, context)
        dataproc = batch_settings(config)
        self.project_id, self.region = config.project, config.region
        identity = config.hook_identity()
        self.gcp_conn_id, self.impersonation_chain = identity["gcp_conn_id"], identity["impersonation_chain"]
        self.batch_id = batch_id_for(names_for(context, config).prefix)
        self.batch_timeout_s = dataproc.timeout_s
        if self.polling_from_config:
            self.polling_interval_seconds = dataproc.poll_interval_s  # type: ignore[assignment]  # (as above)
        return config

    @cached_property
    def hook(self) -> DataprocHook:
        return PacedDataprocHook(wait_check_interval=self.polling_interval_seconds, gcp_conn_id=self.gcp_conn_id,
                                 impersonation_chain=self.impersonation_chain)

    def execute(self, context: Any) -> Any:
        from gpuflow.dataproc.serverless import build_batch
        from gpuflow.steps.dataproc_batch import run_local_batch, staged_main_file_uri

        config = self.configure(context)
        if config is None:  # a team's own arguments
            return super().execute(context)
        if not config.traits.managed_spark:
            return run_local_batch(config)
        prefix = names_for(context, config).prefix
        self.batch = build_batch(config, staged_main_file_uri(config, prefix, (context["dag"].dag_id,
                                                                                context["run_id"])),
                                 labels={"gpuflow-run": prefix})
        log.info("submitting Dataproc batch %s in %s with %s", self.batch_id, self.region,
                 dict(self.batch.runtime_config.properties))
        super().execute(context)  # creates it (or finds this run's), persists its link, defers or waits for it
        return self._result(config)

    def defer(self, *, trigger: Any, method_name: str, kwargs: dict[str, Any] | None = None,
              timeout: Any = None) -> NoReturn:
        """The provider's deferral, to ``CancellingDataprocBatchTrigger``: the same wait, bounded, cancelling."""
        from airflow.providers.google.cloud.triggers.dataproc import DataprocBatchTrigger

        from gpuflow.triggers.cancelling import CancellingDataprocBatchTrigger

        if type(trigger) is DataprocBatchTrigger:
            _, arguments = trigger.serialize()
            trigger = CancellingDataprocBatchTrigger(**arguments, timeout_s=self.batch_timeout_s,
                                                     cancel_on_kill=self.cancel_on_kill)
            timeout = deferral_timeout(self.batch_timeout_s)
            log.info("deferring until Dataproc batch %s ends (up to %.0fs)", trigger.batch_id, self.batch_timeout_s)
        super().defer(trigger=trigger, method_name=method_name, kwargs=kwargs, timeout=timeout)

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> Any:
        config = self.configure(context)
        if event is not None and "batch_state" not in event:  # the bound's event: the batch ran too long
            raise AirflowFailException(f"{event.get('message')}. Fix: raise dataproc.timeout_s, or find out why the "
                                       "batch runs that long (its driver output, in the console's batch link)")
        super().execute_complete(context, event)
        return None if config is None else self._result(config)

    def handle_batch_status(self, context: Any, state: str, batch_id: str, state_message: str | None = None) -> None:
        from gpuflow.steps.dataproc_batch import failure_message

        if state != "SUCCEEDED":  # it ended: a retry would find it ended, so no retry
            raise AirflowFailException(failure_message(batch_id, state, state_message or ""))
        super().handle_batch_status(context, state, batch_id, state_message)

    def _result(self, config: GpuflowConfig) -> dict[str, Any]:
        from gpuflow.steps.dataproc_batch import batch_result

        finished = self.hook.get_batch(batch_id=self.batch_id, region=self.region, project_id=self.project_id)
        return batch_result(config, finished.name.rsplit("/", 1)[-1], finished.runtime_info.output_uri)

    def on_kill(self) -> None:
        if not self.cancel_on_kill:
            log.info("task killed: cancel_on_kill is False, so the batch goes on")
        elif self.batch_id and self.region:
            from gpuflow.triggers.cancelling import cancel_dataproc_batch

            log.info("task killed: cancelling Dataproc batch %s", self.batch_id)
            cancel_dataproc_batch(self.hook, self.batch_id, self.region, self.project_id)
        else:  # a batch id Dataproc chose: the provider's cancel of the operation it holds
            super().on_kill()  # type: ignore[no-untyped-call]  # (the provider's, unannotated)


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
