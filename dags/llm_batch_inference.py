"""llm_batch_inference: each data interval's JSONL prompts answered by a batch RunInference job, published whole.

preflight -> wait_for_input -> check_quota -> setup -> export_model -> build_container -> verify_gpu -> run_batch
-> publish -> check_gpu_usage -> cleanup

preflight fills the interval's dates into batch.input, batch.output and batch.dead_letter_output. wait_for_input
comes before anything is created, so an interval without input costs nothing (batch.missing_input: skip or fail).
The job writes into the run's staging folders; publish checks that every input line ended answered or
dead-lettered, then replaces the date's folders whole (a rerun or a backfill of a date never duplicates answers),
writes _SUCCESS last and updates the gpuflow_batch_answers Asset. setup and run_batch are setup tasks and cleanup is
their teardown. The waits defer; verify_gpu and run_batch run in the gpuflow_gpu pool. Schedule and catchup come
from the configuration file (batch.schedule, batch.catchup); each run's ds is the start of its data interval.
"""

from __future__ import annotations

import pendulum

# wait_for_input's provider sensor, named here so that the dag-processor imports it once, before it forks each parse
# ([dag_processor] parsing_pre_import_modules); gpuflow.operators.batch extends it.
from airflow.providers.google.cloud.sensors.gcs import GCSObjectExistenceSensor  # noqa: F401
from airflow.sdk import DAG

from gpuflow.operators.airflow_names import cron_data_interval_timetable
from gpuflow.operators.batch import (
    BATCH_ANSWERS_ASSET,
    BatchCleanupOperator,
    BatchGpuUsageOperator,
    BatchPreflightOperator,
    BatchSetupOperator,
    PublishOutputsOperator,
    RunBatchOperator,
    WaitForInputOperator,
)
from gpuflow.operators.preparation import preparation
from gpuflow.runs.task_timeouts import apply_task_timeouts
from gpuflow.runs.trigger_form import FormLayout, attach_trigger_form, form_values
from gpuflow.workflow_names import GPU_POOL

DAG_ID = "llm_batch_inference"
#: The trigger form: the configuration file it shows, the fields set per run, the folded sections.
FORM = FormLayout(
    "configs/local.yaml",
    run_fields=("region", "batch.input", "batch.output", "model.name", "gpu.type",
                "gpu.count", "gpu.machine_type", "model.max_new_tokens"),
    sections=("Batch", "Model", "GPU", "Dataflow workers", "Container", "Export", "Inference batching",
              "Smoke test"),
)
SETTINGS = form_values(FORM)  # the configuration file's values (YAML only: cheap to parse)

with DAG(
    dag_id=DAG_ID,
    description="Answer each interval's JSONL prompts with a batch RunInference job on Dataflow GPUs.",
    # Data intervals, so that the run of ds=2026-01-01 starts once that day has ended, its prompts all in (a plain
    # cron string gives Airflow 3's CronTriggerTimetable: ds would be the day that is just starting).
    schedule=cron_data_interval_timetable(SETTINGS["batch.schedule"], timezone="UTC"),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=bool(SETTINGS["batch.catchup"]),
    max_active_runs=1,  # one interval at a time: the GPU quota is checked for one job
    tags=["gpuflow", "llm", "dataflow", "gpu", "batch"],
    doc_md=__doc__,
    default_args={"retries": 1, "retry_delay": pendulum.duration(seconds=15)},
) as dag:
    preflight = BatchPreflightOperator(task_id="preflight", retries=0)
    config = preflight.output

    wait_for_input = WaitForInputOperator(task_id="wait_for_input", config_json=config)
    prepare = preparation(config, setup=BatchSetupOperator)  # check_quota, setup, export_model, build, verify_gpu
    run_batch = RunBatchOperator(task_id="run_batch", config_json=config, image=prepare.build_container.output,
                                 retries=0, pool=GPU_POOL)
    publish = PublishOutputsOperator(task_id="publish", config_json=config, batch_job=run_batch.output,
                                     outlets=[BATCH_ANSWERS_ASSET])
    check_gpu_usage = BatchGpuUsageOperator(task_id="check_gpu_usage", config_json=config, batch_job=run_batch.output)
    cleanup = BatchCleanupOperator(task_id="cleanup", config_json=config, launch_task_id="run_batch")

    preflight >> wait_for_input >> prepare.group >> run_batch >> publish >> check_gpu_usage >> cleanup
    cleanup.as_teardown(setups=[prepare.setup, run_batch])

attach_trigger_form(dag, FORM)  # after the tasks, so that Airflow does not copy the form into each
apply_task_timeouts(dag)  # every task's execution_timeout, from the configuration file
