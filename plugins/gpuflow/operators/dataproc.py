"""The operators of dataproc_gpu_batch."""

from __future__ import annotations

import logging
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from gpuflow.operators.base import (
    GpuflowStepOperator,
    config_from_params,
    names_for,
    validated_config,
)
from gpuflow.operators.links import DataprocBatchLink

log = logging.getLogger(__name__)


class DataprocPreflightOperator(BaseOperator):
    """The configuration's rules (the Dataproc ones included); the batch needs no emulator."""

    ui_color = "#fff3cd"

    def execute(self, context: Any) -> dict[str, Any]:
        config = config_from_params(context)
        if config.dataproc is None:
            raise AirflowFailException("the configuration has no dataproc section. Fix: use "
                                       "configs/dataproc.example.yaml or add a dataproc: section.")
        return validated_config(config, context, "dataproc", "the Dataproc batch")


class DataprocBatchOperator(GpuflowStepOperator):
    """Runs the batch (local Spark, or Dataproc Serverless); returns the job's result; ``on_kill`` cancels it."""

    ui_color = "#d4edda"
    operator_extra_links = (DataprocBatchLink(),)
    _config = None
    _operation_name = None

    def execute(self, context: Any) -> Any:
        from gpuflow.config import config_from_json
        from gpuflow.dataproc import batch_id_for
        from gpuflow.platform.console import dataproc_batch_url
        from gpuflow.steps.dataproc_batch import BatchFailed, run_local_batch, submit_gcp_batch

        config = self._config = config_from_json(self.config_json)
        if config.profile == "local":
            return run_local_batch(config)
        prefix = names_for(context, config).prefix
        batch_url = dataproc_batch_url(config.project, config.region, batch_id_for(prefix))
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
