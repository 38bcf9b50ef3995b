"""dataproc_gpu_batch: a Spark batch with GPUs on Dataproc Serverless, checked against the guide's rules.

preflight and batch (setup tasks) -> cleanup (teardown). gcp: the batch task is the provider's
DataprocCreateBatchOperator, extended (gpuflow.operators.dataproc): a batch id derived from the run, a wait that
defers, ends at dataproc.timeout_s and cancels the batch when the task is killed; the batch is deleted afterwards.
local: the same PySpark file runs on local Spark. The job's result (the executors' GPU count) goes to XCom.
"""

from __future__ import annotations

import pendulum

# The batch task's provider operator, named here so that the dag-processor imports it once, before it forks each
# parse ([dag_processor] parsing_pre_import_modules); gpuflow.operators.dataproc extends it.
from airflow.providers.google.cloud.operators.dataproc import DataprocCreateBatchOperator  # noqa: F401
from airflow.sdk import DAG

from gpuflow.operators.dataproc import DataprocBatchOperator, DataprocCleanupOperator, DataprocPreflightOperator
from gpuflow.runs.task_timeouts import apply_task_timeouts
from gpuflow.runs.trigger_form import FormLayout, attach_trigger_form
from gpuflow.workflow_names import GPU_POOL

#: The trigger form: the configuration file it shows, the fields set per run, the folded sections.
FORM = FormLayout("configs/dataproc.example.yaml",
                  run_fields=("region", "dataproc.accelerator",
                              "dataproc.executor_instances"),
                  sections=("Dataproc batch",))

with DAG(
    dag_id="dataproc_gpu_batch",
    description="A Dataproc Serverless GPU Spark batch: validate, submit, wait, clean up.",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["gpuflow", "dataproc", "spark", "gpu"],
    doc_md=__doc__,
) as dag:
    preflight = DataprocPreflightOperator(task_id="preflight")
    batch = DataprocBatchOperator(task_id="batch", config_json=preflight.output, retries=1, pool=GPU_POOL)
    cleanup = DataprocCleanupOperator(task_id="cleanup", config_json=preflight.output)
    preflight >> batch >> cleanup
    # preflight is a setup too: once it passed, cleanup runs whatever the batch did.
    cleanup.as_teardown(setups=[preflight, batch])

attach_trigger_form(dag, FORM)  # after the tasks, so that Airflow does not copy the form into each
apply_task_timeouts(dag)  # every task's execution_timeout, from the configuration file
