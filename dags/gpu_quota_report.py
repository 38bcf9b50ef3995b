"""gpu_quota_report: daily GPU capacity check for llm_streaming_inference.

gcp profile: the Compute Engine regional quota and usage of the configured GPU's metric (for example
NVIDIA_L4_GPUS) in the configured region and every fallback region; it warns when the headroom is below
gpu.count x worker.max_num_workers. local profile: the GPUs of the Airflow worker (nvidia-smi, torch).
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from gpuflow.operators.quota_report import GpuQuotaReportOperator
from gpuflow.runs.task_timeouts import apply_task_timeouts
from gpuflow.runs.trigger_form import FormLayout, attach_trigger_form

#: The trigger form: the configuration file it shows, the fields set per run, the folded sections.
FORM = FormLayout("configs/local.yaml",
                  run_fields=("region", "gpu.type", "gpu.count", "worker.max_num_workers"),
                  sections=("GPU",))

with DAG(
    dag_id="gpu_quota_report",
    description="Daily GPU quota headroom (gcp) or local GPU report (local).",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["gpuflow", "gpu", "quota"],
    doc_md=__doc__,
) as dag:
    GpuQuotaReportOperator(task_id="report", retries=2, retry_delay=pendulum.duration(minutes=5))

attach_trigger_form(dag, FORM)  # after the tasks, so that Airflow does not copy the form into each
apply_task_timeouts(dag)  # every task's execution_timeout, from the configuration file
