"""gpuflow_janitor: every day, delete what gpuflow left behind that nothing owns any more.

It lists gpuflow's Dataflow jobs (or local pipeline processes), topics, subscriptions, run buckets and run prefixes
(all named gf-<run>-… or gfd-<deployment>-…), keeps what a running DAG run or a recorded deployment owns, and
cancels and deletes the rest: what a killed worker, a deleted DAG run or a teardown that died left billing.
janitor.dry_run: true lists it and deletes nothing. The task log says what it found and what it did.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from gpuflow.operators.deployment import JanitorOperator, MaintenancePreflightOperator
from gpuflow.runs.task_timeouts import apply_task_timeouts
from gpuflow.runs.trigger_form import FormLayout, attach_trigger_form

#: The trigger form: the configuration file it shows, the fields set per run, the folded sections.
FORM = FormLayout("configs/local.yaml", run_fields=("region", "janitor.dry_run"),
                  sections=("Dataflow workers",))

with DAG(
    dag_id="gpuflow_janitor",
    description="Daily: cancel and delete gpuflow jobs, topics, subscriptions and buckets that nothing owns.",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["gpuflow", "cleanup"],
    doc_md=__doc__,
    default_args={"retries": 1, "retry_delay": pendulum.duration(seconds=60)},
) as dag:
    preflight = MaintenancePreflightOperator(task_id="preflight", retries=0)
    JanitorOperator(task_id="janitor", config_json=preflight.output)

attach_trigger_form(dag, FORM)
apply_task_timeouts(dag)
