"""gpuflow's DAGs, made from one configuration file: each function below is one DAG, its tasks and its trigger form.

A DAG file calls ``site_dags`` with its site's configuration file (``gpuflow.sites``: ``dags/<site>/gpuflow_site.py``),
or, in the repository's own ``dags/`` folder, ``local_dags`` with configs/local.yaml's. The file is fixed here, when
the DAG file is parsed: a run's conf chooses the form's fields, never the file (``gpuflow.runs.run_policy``).

Each function imports its own operators, so that a DAG file that builds one DAG imports that DAG's operators only.
Nothing below gpuflow's DAG files imports this module.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import DAG

from gpuflow.runs.task_timeouts import apply_task_timeouts
from gpuflow.runs.trigger_form import FormLayout, attach_trigger_form, file_has_section, form_values
from gpuflow.sites import has_site_folders, site_dag_id, site_name
from gpuflow.workflow_names import GPU_POOL

START = pendulum.datetime(2026, 1, 1, tz="UTC")
#: The repository's own DAGs read these files where the DAG folder holds no site folder (``local_dags``).
LOCAL_CONFIG = "configs/local.yaml"
LOCAL_DATAPROC_CONFIG = "configs/dataproc.example.yaml"


class Site:
    """The configuration file a set of DAGs reads, and the name that sets their ids and tags apart (None: the
    repository's own DAGs, whose ids are gpuflow's names alone)."""

    __slots__ = ("config_file", "name")

    def __init__(self, config_file: str, name: str | None):
        self.config_file, self.name = config_file, name

    def dag_id(self, dag_name: str) -> str:
        return site_dag_id(self.name, dag_name)

    def tags(self, *tags: str) -> list[str]:
        return ["gpuflow", *tags, *([f"site:{self.name}"] if self.name else [])]


def _dag(site: Site, made_by: Callable[[Site], DAG], description: str, schedule: object, tags: tuple[str, ...],
         **kwargs: Any) -> DAG:
    """A DAG of the site, named and documented after the function below that makes it."""
    kwargs.setdefault("catchup", False)
    return DAG(dag_id=site.dag_id(made_by.__name__), description=description, schedule=schedule, start_date=START,
               tags=site.tags(*tags), doc_md=inspect.cleandoc(made_by.__doc__ or ""), **kwargs)


def _finish(dag: DAG, form: FormLayout) -> DAG:
    attach_trigger_form(dag, form)  # after the tasks, so that Airflow does not copy the form into each
    apply_task_timeouts(dag)  # every task's execution_timeout, from the configuration file
    return dag


def llm_streaming_inference(site: Site) -> DAG:
    """llm_streaming_inference: from model weights to a streaming RunInference pipeline that answers prompts.

    preflight -> check_quota -> setup -> export_model -> build_container -> verify_gpu -> evaluate -> launch ->
    smoke_test -> promote -> cleanup

    deployment.mode ephemeral (the default): the run proves the pipeline and deletes everything it made.
    deployment.mode persistent: the run rolls its model version out to a lasting deployment (preflight says which
    path: the weights alone, an update in place, or a replacement job), evaluate gates it on an evaluation set
    (rollout.eval_set: the candidate's scores and latency against the serving version's) before anything switches,
    promote records it, and cleanup deletes only what the run made for itself; a version that fails the smoke test is
    rolled back. llm_streaming_teardown stops it.

    setup and launch are Airflow setup tasks and cleanup is their teardown: once anything was created, cleanup runs
    even when a later task fails, and the run still ends failed. The tasks that wait on Google (or on the local
    pipeline process) defer: the triggerer waits, not a worker. verify_gpu, evaluate and launch run in the gpuflow_gpu
    pool.
    """
    from gpuflow.operators.deployment import EvaluateOperator, PromoteOperator
    from gpuflow.operators.preparation import preparation
    from gpuflow.operators.streaming import (
        CleanupOperator,
        LaunchPipelineOperator,
        PreflightOperator,
        SmokeTestOperator,
    )

    form = FormLayout(
        site.config_file,
        run_fields=("region", "deployment.mode", "deployment.name", "model.name",
                    "gpu.type", "gpu.count", "gpu.machine_type", "model.max_new_tokens"),
        sections=("Deployment", "Model", "GPU", "Dataflow workers", "Container", "Export", "Inference batching",
                  "Smoke test"),
        file_only=("rollout.eval_set", "rollout.score", "rollout.max_score_drop", "rollout.max_latency_ratio",
                   "rollout.min_latency_pairs", "rollout.warmup_batches", "rollout.max_rounds"),
    )
    with _dag(site, llm_streaming_inference, "Export an LLM, build its GPU container, launch a streaming "
              "RunInference pipeline, ask it, clean up.", None, ("llm", "dataflow", "gpu"), max_active_runs=1,
              default_args={"retries": 1, "retry_delay": pendulum.duration(seconds=15)}) as dag:
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
    return _finish(dag, form)


def llm_batch_inference(site: Site) -> DAG:
    """llm_batch_inference: each data interval's JSONL prompts answered by a batch RunInference job, published whole.

    preflight -> wait_for_input -> check_quota -> setup -> export_model -> build_container -> verify_gpu -> run_batch
    -> publish -> check_gpu_usage -> cleanup

    preflight fills the interval's dates into batch.input, batch.output and batch.dead_letter_output. wait_for_input
    comes before anything is created, so an interval without input costs nothing (batch.missing_input: skip or fail).
    The job writes into the run's staging folders; publish checks that every input line ended answered or
    dead-lettered, then replaces the date's folders whole (a rerun or a backfill of a date never duplicates answers),
    writes _SUCCESS last and updates the gpuflow_batch_answers Asset. setup and run_batch are setup tasks and cleanup
    is their teardown. The waits defer; verify_gpu and run_batch run in the gpuflow_gpu pool. Schedule and catchup
    come from the configuration file (batch.schedule, batch.catchup); each run's ds is the start of its data
    interval.
    """
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

    form = FormLayout(
        site.config_file,
        run_fields=("region", "batch.input", "batch.output", "model.name", "gpu.type",
                    "gpu.count", "gpu.machine_type", "model.max_new_tokens"),
        sections=("Batch", "Model", "GPU", "Dataflow workers", "Container", "Export", "Inference batching",
                  "Smoke test"),
    )
    settings = form_values(form)  # the configuration file's values (YAML only: cheap to parse)
    # Data intervals, so that the run of ds=2026-01-01 starts once that day has ended, its prompts all in (a plain
    # cron string gives Airflow 3's CronTriggerTimetable: ds would be the day that is just starting).
    schedule = cron_data_interval_timetable(settings["batch.schedule"], timezone="UTC")
    with _dag(site, llm_batch_inference, "Answer each interval's JSONL prompts with a batch RunInference job on "
              "Dataflow GPUs.", schedule, ("llm", "dataflow", "gpu", "batch"), catchup=bool(settings["batch.catchup"]),
              max_active_runs=1,  # one interval at a time: the GPU quota is checked for one job
              default_args={"retries": 1, "retry_delay": pendulum.duration(seconds=15)}) as dag:
        preflight = BatchPreflightOperator(task_id="preflight", retries=0)
        config = preflight.output

        wait_for_input = WaitForInputOperator(task_id="wait_for_input", config_json=config)
        prepare = preparation(config, setup=BatchSetupOperator)  # check_quota, setup, export_model, build, verify_gpu
        run_batch = RunBatchOperator(task_id="run_batch", config_json=config, image=prepare.build_container.output,
                                     retries=0, pool=GPU_POOL)
        publish = PublishOutputsOperator(task_id="publish", config_json=config, batch_job=run_batch.output,
                                         outlets=[BATCH_ANSWERS_ASSET])
        check_gpu_usage = BatchGpuUsageOperator(task_id="check_gpu_usage", config_json=config,
                                                batch_job=run_batch.output)
        cleanup = BatchCleanupOperator(task_id="cleanup", config_json=config, launch_task_id="run_batch")

        preflight >> wait_for_input >> prepare.group >> run_batch >> publish >> check_gpu_usage >> cleanup
        cleanup.as_teardown(setups=[prepare.setup, run_batch])
    return _finish(dag, form)


def llm_streaming_teardown(site: Site) -> DAG:
    """llm_streaming_teardown: stop a persistent deployment of llm_streaming_inference and delete what it owns.

    Its job is drained or cancelled (dataflow.stop_action; the task defers while it stops), then its prompts
    subscription, its topics, its model folder and its record go. Trigger it with the deployment's name
    (deployment.name; empty: llm-streaming-inference). A deployment that has no record left is still cleaned by its
    name's prefix.
    """
    from gpuflow.operators.deployment import MaintenancePreflightOperator, TeardownOperator

    form = FormLayout(site.config_file, run_fields=("region", "deployment.name"), sections=("Dataflow workers",))
    with _dag(site, llm_streaming_teardown, "Stop a persistent llm_streaming_inference deployment and delete its "
              "topics, model and record.", None, ("llm", "dataflow"), max_active_runs=1,
              default_args={"retries": 1, "retry_delay": pendulum.duration(seconds=15)}) as dag:
        preflight = MaintenancePreflightOperator(task_id="preflight", retries=0)
        TeardownOperator(task_id="teardown", config_json=preflight.output)
    return _finish(dag, form)


def gpuflow_janitor(site: Site) -> DAG:
    """gpuflow_janitor: every day, delete what gpuflow left behind that nothing owns any more.

    It lists gpuflow's Dataflow jobs (or local pipeline processes), topics, subscriptions, run buckets and run
    prefixes (all named gf-<run>-… or gfd-<deployment>-…), keeps what a running DAG run or a recorded deployment
    owns, and cancels and deletes the rest: what a killed worker, a deleted DAG run or a teardown that died left
    billing. janitor.dry_run: true lists it and deletes nothing. The task log says what it found and what it did.
    """
    from gpuflow.operators.deployment import JanitorOperator, MaintenancePreflightOperator

    form = FormLayout(site.config_file, run_fields=("region", "janitor.dry_run"), sections=("Dataflow workers",))
    with _dag(site, gpuflow_janitor, "Daily: cancel and delete gpuflow jobs, topics, subscriptions and buckets "
              "that nothing owns.", "@daily", ("cleanup",), max_active_runs=1,
              default_args={"retries": 1, "retry_delay": pendulum.duration(seconds=60)}) as dag:
        preflight = MaintenancePreflightOperator(task_id="preflight", retries=0)
        JanitorOperator(task_id="janitor", config_json=preflight.output)
    return _finish(dag, form)


def gpu_quota_report(site: Site) -> DAG:
    """gpu_quota_report: daily GPU capacity check for llm_streaming_inference.

    gcp profile: the Compute Engine regional quota and usage of the configured GPU's metric (for example
    NVIDIA_L4_GPUS) in the configured region and every fallback region; it warns when the headroom is below
    gpu.count x worker.max_num_workers. local profile: the GPUs of the Airflow worker (nvidia-smi, torch).
    """
    from gpuflow.operators.quota_report import GpuQuotaReportOperator

    form = FormLayout(site.config_file, run_fields=("region", "gpu.type", "gpu.count", "worker.max_num_workers"),
                      sections=("GPU",))
    with _dag(site, gpu_quota_report, "Daily GPU quota headroom (gcp) or local GPU report (local).", "@daily",
              ("gpu", "quota")) as dag:
        GpuQuotaReportOperator(task_id="report", retries=2, retry_delay=pendulum.duration(minutes=5))
    return _finish(dag, form)


def dataproc_gpu_batch(site: Site) -> DAG:
    """dataproc_gpu_batch: a Spark batch with GPUs on Dataproc Serverless, checked against the guide's rules.

    preflight and batch (setup tasks) -> cleanup (teardown). gcp: the batch task is the provider's
    DataprocCreateBatchOperator, extended (gpuflow.operators.dataproc): a batch id derived from the run, a wait that
    defers, ends at dataproc.timeout_s and cancels the batch when the task is killed; the batch is deleted
    afterwards. local: the same PySpark file runs on local Spark. The job's result (the executors' GPU count) goes to
    XCom.
    """
    from gpuflow.operators.dataproc import DataprocBatchOperator, DataprocCleanupOperator, DataprocPreflightOperator

    form = FormLayout(site.config_file, run_fields=("region", "dataproc.accelerator", "dataproc.executor_instances"),
                      sections=("Dataproc batch",))
    with _dag(site, dataproc_gpu_batch, "A Dataproc Serverless GPU Spark batch: validate, submit, wait, clean up.",
              None, ("dataproc", "spark", "gpu")) as dag:
        preflight = DataprocPreflightOperator(task_id="preflight")
        batch = DataprocBatchOperator(task_id="batch", config_json=preflight.output, retries=1, pool=GPU_POOL)
        cleanup = DataprocCleanupOperator(task_id="cleanup", config_json=preflight.output)
        preflight >> batch >> cleanup
        # preflight is a setup too: once it passed, cleanup runs whatever the batch did.
        cleanup.as_teardown(setups=[preflight, batch])
    return _finish(dag, form)


#: Every DAG a site may have, by gpuflow's name for it.
FACTORIES: dict[str, Callable[[Site], DAG]] = {
    factory.__name__: factory
    for factory in (llm_streaming_inference, llm_batch_inference, llm_streaming_teardown, gpuflow_janitor,
                    gpu_quota_report, dataproc_gpu_batch)
}


def site_dags(config_file: str, only: tuple[str, ...] = ()) -> dict[str, DAG]:
    """The DAGs of the site whose configuration file is ``config_file``, by DAG id: every one, dataproc_gpu_batch
    only where the file has a dataproc section (``only``: just those, by gpuflow's name)."""
    site = Site(config_file, site_name(config_file))
    names = only or tuple(name for name in FACTORIES
                          if name != "dataproc_gpu_batch" or file_has_section(config_file, "dataproc"))
    return {site.dag_id(name): FACTORIES[name](site) for name in names}


def site_dag(config_file: str, dag_name: str) -> DAG:
    """One DAG of a site (``site_dags``), by gpuflow's name for it."""
    return next(iter(site_dags(config_file, only=(dag_name,)).values()))


def local_dags(dag_name: str, dags_folder: str | Path) -> dict[str, DAG]:
    """The repository's own DAG ``dag_name``, under gpuflow's name for it, made from configs/local.yaml
    (dataproc_gpu_batch: configs/dataproc.example.yaml); none where ``dags_folder`` holds site folders, which
    replace it."""
    if has_site_folders(Path(dags_folder)):
        return {}
    config_file = LOCAL_DATAPROC_CONFIG if dag_name == "dataproc_gpu_batch" else LOCAL_CONFIG
    return {dag_name: FACTORIES[dag_name](Site(config_file, None))}
