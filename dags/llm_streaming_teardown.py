"""llm_streaming_teardown: stop a persistent deployment of llm_streaming_inference and delete what it owns.

Its job is drained or cancelled (dataflow.stop_action; the task defers while it stops), then its prompts
subscription, its topics, its model folder and its record go. Trigger it with the deployment's name
(deployment.name; empty: llm-streaming-inference). A deployment that has no record left is still cleaned by its
name's prefix.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from gpuflow.operators.deployment import MaintenancePreflightOperator, TeardownOperator
from gpuflow.runs.task_timeouts import apply_task_timeouts
from gpuflow.runs.trigger_form import FormLayout, attach_trigger_form

#: The trigger form: the configuration file it shows, the fields set per run, the folded sections.
FORM = FormLayout("configs/local.yaml", run_fields=("region", "deployment.name"),
                  sections=("Dataflow workers",))

with DAG(
    dag_id="llm_streaming_teardown",
    description="Stop a persistent llm_streaming_inference deployment and delete its topics, model and record.",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["gpuflow", "llm", "dataflow"],
    doc_md=__doc__,
    default_args={"retries": 1, "retry_delay": pendulum.duration(seconds=15)},
) as dag:
    preflight = MaintenancePreflightOperator(task_id="preflight", retries=0)
    TeardownOperator(task_id="teardown", config_json=preflight.output)

attach_trigger_form(dag, FORM)
apply_task_timeouts(dag)
