"""llm_streaming_inference: from model weights to a streaming RunInference pipeline that answers prompts.

preflight -> check_quota -> setup -> export_model -> build_container -> verify_gpu -> evaluate -> launch -> smoke_test
-> promote -> cleanup

deployment.mode ephemeral (the default): the run proves the pipeline and deletes everything it made.
deployment.mode persistent: the run rolls its model version out to a lasting deployment (preflight says which
path: the weights alone, an update in place, or a replacement job), evaluate gates it on an evaluation set
(rollout.eval_set: the candidate's scores and latency against the serving version's) before anything switches,
promote records it, and cleanup deletes only what the run made for itself; a version that fails the smoke test is
rolled back. llm_streaming_teardown stops it.

setup and launch are Airflow setup tasks and cleanup is their teardown: once anything was created,
cleanup runs even when a later task fails, and the run still ends failed. The tasks that wait on Google (or on the
local pipeline process) defer: the triggerer waits, not a worker. verify_gpu, evaluate and launch run in the gpuflow_gpu
pool.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from gpuflow.operators.deployment import EvaluateOperator, PromoteOperator
from gpuflow.operators.preparation import preparation
from gpuflow.operators.streaming import CleanupOperator, LaunchPipelineOperator, PreflightOperator, SmokeTestOperator
from gpuflow.runs.task_timeouts import apply_task_timeouts
from gpuflow.runs.trigger_form import FormLayout, attach_trigger_form
from gpuflow.workflow_names import GPU_POOL

#: The trigger form: the configuration file it shows, the fields set per run, the folded sections.
FORM = FormLayout(
    "configs/local.yaml",
    run_fields=("region", "deployment.mode", "deployment.name", "model.name",
                "gpu.type", "gpu.count", "gpu.machine_type", "model.max_new_tokens"),
    sections=("Deployment", "Model", "GPU", "Dataflow workers", "Container", "Export", "Inference batching",
              "Smoke test"),
    file_only=("rollout.eval_set", "rollout.score", "rollout.max_score_drop", "rollout.max_latency_ratio",
               "rollout.min_latency_pairs", "rollout.warmup_batches", "rollout.max_rounds"),
)

with DAG(
    dag_id="llm_streaming_inference",
    description="Export an LLM, build its GPU container, launch a streaming RunInference pipeline, ask it, clean up.",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["gpuflow", "llm", "dataflow", "gpu"],
    doc_md=__doc__,
    default_args={"retries": 1, "retry_delay": pendulum.duration(seconds=15)},
) as dag:
    preflight = PreflightOperator(task_id="preflight", retries=0)
    config = preflight.output

    prepare = preparation(config)  # check_quota, setup, export_model, build_container, verify_gpu
    image = prepare.build_container.output
    evaluate = EvaluateOperator(task_id="evaluate", config_json=config, image=image, retries=0, pool=GPU_POOL)
    launch = LaunchPipelineOperator(task_id="launch", config_json=config, image=image, retries=0, pool=GPU_POOL)
    smoke_test = SmokeTestOperator(task_id="smoke_test", config_json=config, job_handle=launch.output)
    promote = PromoteOperator(task_id="promote", config_json=config, image=image, job_handle=launch.output,
                              evaluation=evaluate.output, retries=0)
    cleanup = CleanupOperator(task_id="cleanup", config_json=config, launch_task_id="launch")

    preflight >> prepare.group >> evaluate >> launch >> smoke_test >> promote >> cleanup
    cleanup.as_teardown(setups=[prepare.setup, launch])

attach_trigger_form(dag, FORM)  # after the tasks, so that Airflow does not copy the form into each
apply_task_timeouts(dag)  # every task's execution_timeout, from the configuration file
