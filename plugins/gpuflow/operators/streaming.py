"""The operators of llm_streaming_inference, one per step (gpuflow.steps does the work)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import Asset, BaseOperator

from gpuflow.operators.airflow_names import AirflowException, AirflowFailException
from gpuflow.operators.base import (
    ROLLOUT_KEY,
    JobWaitingOperator,
    PlainArguments,
    event_succeeded,
    names_for,
    rollout_plan,
    validated_config,
)
from gpuflow.operators.links import CloudBuildConsoleLink, DataflowConsoleLink, VertexAIConsoleLink
from gpuflow.operators.run_config import DerivesRunConfig
from gpuflow.workflow_names import LAUNCH_TASK

if TYPE_CHECKING:
    from gpuflow.configuration.model import GpuflowConfig
    from gpuflow.platform import JobHandle, Platform
    from gpuflow.runs.naming import ResourceNames
    from gpuflow.runs.rollout import RolloutPlan
    from gpuflow.steps.smoke import SmokeRound

log = logging.getLogger(__name__)

#: Updated by every export_model run; the event's extra says where the bf16 state_dict lies
#: ({"state_dict_uri", "model_dir_uri", "model", "kept"}). Downstream DAGs schedule on it (docs/models.md).
#: Named, without a URI scheme: a scheme makes Airflow load every provider to normalise it (a second per parse).
STATE_DICT_ASSET = Asset(name="gpuflow_state_dict")


class PreflightOperator(DerivesRunConfig, BaseOperator):
    """Validate the configuration and the environment; fail before anything is created.

    Both profiles: the configuration's own rules, then what the profile can read (local: this machine, the
    emulators; gcp: the region's zones, the project's APIs, IAM, policies and bucket; on Composer: the GPU pool).
    It waits for nothing. Its result is the validated configuration as JSON, which the other gpuflow operators take
    as ``config_json``.

    :param config_file: the configuration file (in ``configs/`` or the site folder, or an absolute path the DAG's
        author chose). Without it, the configuration comes from the DAG's trigger form and the run's conf
        (gpuflow's own DAGs); with it, the run's conf is not read.
    :param settings: dotted keys over the file's values (``{"model.max_new_tokens": 8}``), set by the DAG's author.
        Both are templated; a template that reads ``dag_run.conf`` hands the choice to whoever triggers the run,
        past gpuflow's run policy (``gpuflow.runs.run_policy``), so read the team's own tasks' results instead.
    """

    template_fields = ("config_file", "settings")
    execution_timeout_from = "short"  # its execution_timeout: gpuflow.runs.task_timeouts

    ui_color = "#fff3cd"

    def __init__(self, *, config_file: str | None = None, settings: dict[str, Any] | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.config_file, self.settings = config_file, settings

    def execute(self, context: Any) -> dict[str, Any]:
        config = self.derive_config(context)
        result = validated_config(config, context, self.workflow, f"run {names_for(context, config).prefix}")
        if self.workflow == "inference" and config.deployment.mode == "persistent":
            context["ti"].xcom_push(key=ROLLOUT_KEY, value=self._plan(config, context).model_dump(mode="json"))
        return result

    @staticmethod
    def _plan(config: GpuflowConfig, context: Any) -> RolloutPlan:
        """A persistent deployment: which rollout path this run takes, and why (logged)."""
        from gpuflow.configuration.model import ConfigError
        from gpuflow.platform import get_platform
        from gpuflow.steps.deployment import plan

        platform = get_platform(config)
        with platform.environment():
            try:
                return plan(config, names_for(context, config), platform)
            except ConfigError as error:  # another configuration's deployment: refused before anything is made
                raise AirflowFailException(str(error)) from None


class SetupResourcesOperator(PlainArguments):
    """Creates the run's prompts and answers topics, their subscriptions and the run's bucket (or prefix), each
    labelled with the run's names, through the provider's PubSubHook and GCSHook: the emulators locally, Google on gcp
    (one code path, ``steps/resources.py``). It waits for nothing.

    :param config_json: the validated configuration, ``PreflightOperator``'s result (``preflight.output``); or,
        in a team's DAG without a gpuflow configuration file, the plain arguments (``PlainArguments``) and:
    :param bucket: the team's bucket, for the run's objects under its prefix (default: a bucket of the run's own,
        which the run's cleanup deletes).
    """

    execution_timeout_from = "short"  # its execution_timeout: gpuflow.runs.task_timeouts
    job_arguments = {"bucket": "bucket"}
    template_fields: Sequence[str] = ("config_json", *PlainArguments.provider_arguments, "bucket")

    def __init__(self, *, bucket: str | None = None, **kwargs: Any) -> None:
        self.bucket = bucket
        super().__init__(**kwargs)

    def execute_step(self, config: GpuflowConfig, names: ResourceNames, platform: Platform, context: Any) -> Any:
        from gpuflow.steps.resources import create_resources

        rollout = rollout_plan(context, config, names, platform.conn_id)
        return create_resources(config, names, platform.conn_id,
                                job_subscription=rollout is None or rollout.path != "weights",
                                lease=(context["dag"].dag_id, context["run_id"]))


class QuotaCheckOperator(PlainArguments):
    """Fail before anything is created when the GPUs the workers need are not there.

    gcp: the GPU's regional quota (Compute Engine, or Cloud Quotas for a GPU family) and GPUS_ALL_REGIONS must cover
    ``worker.max_num_workers`` times ``gpu.count``; an unreported quota is a warning with where to read it. local:
    this machine's GPUs (nvidia-smi), reported. It waits for nothing.

    :param config_json: the validated configuration, ``PreflightOperator``'s result (``preflight.output``); or,
        in a team's DAG without a gpuflow configuration file, the plain arguments (``PlainArguments``) and:
    :param gpu_type: the GPU (``nvidia-l4``, ...; default nvidia-l4).
    :param gpu_count: GPUs per worker (default 1).
    :param max_num_workers: the most workers a job may scale to (default 1).
    """

    execution_timeout_from = "short"  # its execution_timeout: gpuflow.runs.task_timeouts

    ui_color = "#fff3cd"
    job_arguments = {"gpu_type": "gpu.type", "gpu_count": "gpu.count", "max_num_workers": "worker.max_num_workers"}
    template_fields: Sequence[str] = ("config_json", *PlainArguments.provider_arguments, *job_arguments)

    def __init__(self, *, gpu_type: str | None = None, gpu_count: int | str | None = None,
                 max_num_workers: int | str | None = None, **kwargs: Any) -> None:
        self.gpu_type, self.gpu_count, self.max_num_workers = gpu_type, gpu_count, max_num_workers
        super().__init__(**kwargs)

    def execute_step(self, config: GpuflowConfig, names: ResourceNames, platform: Platform, context: Any) -> Any:
        from gpuflow.steps.quota import QuotaTooLow, check_quota

        rollout = rollout_plan(context, config, names, platform.conn_id)
        if rollout is not None and rollout.path == "weights":
            log.info("only the weights change: the running job needs no new workers, so no quota")
            return {"skipped": "weights only: no new workers"}
        try:
            return check_quota(config, platform)
        except QuotaTooLow as error:
            raise AirflowFailException(str(error)) from None  # quota does not grow on retry


class ExportModelOperator(PlainArguments, JobWaitingOperator):
    """Exports the model's bf16 state_dict, config and tokenizer to the run's model folder; skipped when the same
    model in bf16 is already there (a retry, a re-run).

    local: beam_jobs/download_model.py runs in the task, from the offline demo model or a local checkpoint (it waits
    for it there). gcp: a Vertex AI custom job runs it; the task waits for the job to end, deferred (up to
    ``export.timeout_s``; the first ``HOLD_S`` in its worker, ``gpuflow.triggers.settle``).
    ``on_kill`` (and the trigger's, while deferred) cancels the job. A retry starts no second custom job: it waits on
    the one an earlier try started while that still runs, found by its name and ``gpuflow-run`` label.

    :param config_json: the validated configuration, ``PreflightOperator``'s result (``preflight.output``); or,
        in a team's DAG without a gpuflow configuration file, the plain arguments (``PlainArguments``) and:
    :param model: the Hugging Face model: a hub name, a local directory, or gpuflow's offline demo model (the
        default, ``gpuflow-demo``).
    :param bucket: the bucket the export writes to (and, on gcp, the custom job's script is staged in). It must
        exist: without a gpuflow configuration, no setup task creates one.
    :param model_dir: a ``gs://`` folder in ``bucket`` to export into and keep (default: under the run's prefix).
    :param machine_type: the Vertex AI machine type (default: from the model's size).
    """

    execution_timeout_from = "export"  # its execution_timeout: gpuflow.runs.task_timeouts

    operator_extra_links = (VertexAIConsoleLink(),)
    job_arguments = {"model": "model.name", "bucket": "bucket", "model_dir": "export.model_dir",
                     "machine_type": "export.machine_type"}
    template_fields: Sequence[str] = ("config_json", *PlainArguments.provider_arguments, *job_arguments,
                                      "poll_interval")

    def __init__(self, *, model: str | None = None, bucket: str | None = None, model_dir: str | None = None,
                 machine_type: str | None = None, **kwargs: Any) -> None:
        self.model, self.bucket, self.model_dir, self.machine_type = model, bucket, model_dir, machine_type
        super().__init__(**kwargs)

    def execute_step(self, config: GpuflowConfig, names: ResourceNames, platform: Platform, context: Any) -> Any:
        from gpuflow.steps.export import export_model

        result = export_model(config, names, platform)
        job = result.pop("job", None)
        if job:  # gcp: a Vertex AI custom job runs it
            return self.wait_on_started_job(context, config, platform, job, VertexAIConsoleLink,
                                            config.export.timeout_s, result=result)
        return self._exported(config, context, result)

    def execute_complete_step(self, config: GpuflowConfig, names: ResourceNames, platform: Platform, context: Any,
                              event: dict[str, Any], *, handle: JobHandle, result: dict[str, Any]) -> Any:
        if not event_succeeded(event):
            raise AirflowException(f"the export failed: {event.get('message')}. Fix: read the job's logs in the "
                                   "Vertex AI console (the task's link); a larger export.machine_type helps when it "
                                   "ran out of memory.")
        log.info("%s", event.get("message"))
        return self._exported(config, context, result)

    @staticmethod
    def _exported(config: GpuflowConfig, context: Any, result: dict[str, Any]) -> dict[str, Any]:
        context["outlet_events"][STATE_DICT_ASSET].extra = {
            "state_dict_uri": result["state_dict_uri"], "model_dir_uri": result["model_dir_uri"],
            "model": result["model"], "kept": bool(config.export.model_dir),
        }
        return result

    def stop_job(self, platform: Platform, handle: JobHandle) -> None:
        platform.cancel_export(handle.name)


class BuildContainerOperator(PlainArguments, JobWaitingOperator):
    """Renders the worker image's recipe with its lock, checks it statically, and builds it where it can; an image
    named in ``container.image`` is used as it is.

    local: ``docker build`` where a Docker engine answers, else the task reports NOT BUILT and waits for nothing.
    gcp: nothing is built when Artifact Registry has the content's tag; otherwise Cloud Build is started and the
    task waits for it to end, deferred (up to ``container.build_timeout_s``). ``on_kill`` (and the trigger's, while
    deferred) cancels the build. A retry starts no second build: it waits on the one an earlier try started while
    that still runs, found by the run's tag among the region's newest builds.

    :param config_json: the validated configuration, ``PreflightOperator``'s result (``preflight.output``); or,
        in a team's DAG without a gpuflow configuration file, the plain arguments (``PlainArguments``) and:
    :param gpu_type: the GPU the image is for (``nvidia-l4``, ...; default nvidia-l4; ``none``: the CPU recipe).
    :param recipe: the recipe in docker/ (default: from the GPU type).
    :param image: an image to use as it is, building nothing (default: built, tagged with its content's digest).
    :param repository: the Artifact Registry Docker repository (default gpuflow).
    :param bucket: the bucket Cloud Build's source is staged in (gcp).
    """

    execution_timeout_from = "build"  # its execution_timeout: gpuflow.runs.task_timeouts

    operator_extra_links = (CloudBuildConsoleLink(),)
    job_arguments = {"gpu_type": "gpu.type", "recipe": "container.recipe", "image": "container.image",
                     "repository": "container.repository", "bucket": "bucket"}
    template_fields: Sequence[str] = ("config_json", *PlainArguments.provider_arguments, *job_arguments,
                                      "poll_interval")

    def __init__(self, *, gpu_type: str | None = None, recipe: str | None = None, image: str | None = None,
                 repository: str | None = None, bucket: str | None = None, **kwargs: Any) -> None:
        self.gpu_type, self.recipe, self.image, self.repository, self.bucket = (gpu_type, recipe, image, repository,
                                                                                bucket)
        super().__init__(**kwargs)

    def execute_step(self, config: GpuflowConfig, names: ResourceNames, platform: Platform, context: Any) -> Any:
        from gpuflow.steps.container import build_container

        result = build_container(config, names, platform)
        job = result.pop("job", None)
        if job:  # gcp: Cloud Build builds it
            return self.wait_on_started_job(context, config, platform, job, CloudBuildConsoleLink,
                                            config.container.build_timeout_s, result=result)
        return result

    def execute_complete_step(self, config: GpuflowConfig, names: ResourceNames, platform: Platform, context: Any,
                              event: dict[str, Any], *, handle: JobHandle, result: dict[str, Any]) -> Any:
        if not event_succeeded(event):
            raise AirflowException(f"Cloud Build {handle.id} failed: {event.get('message')}. Fix: read its log "
                                   "(the task's Cloud Build link).")
        log.info("container image %s: built by Cloud Build %s", result["image"], handle.id)
        return {**result, "built": True, "detail": f"built by Cloud Build {handle.id}"}

    def stop_job(self, platform: Platform, handle: JobHandle) -> None:
        platform.cancel_build(handle.id)


def _image_of(build_result: Any) -> str:
    """build_container's result (through XCom) or an image URI."""
    return (build_result.get("image") if isinstance(build_result, dict) else build_result) or ""


class VerifyGpuOperator(PlainArguments, JobWaitingOperator):
    """Starts the GPU check job where the workers run, defers until it is done, then judges its report.

    gcp: a Dataflow batch job on the configured GPU workers and image; local: beam_jobs/gpu_check.py on the local
    runner. It waits up to ``HOLD_S`` in its worker, then deferred in the triggerer for the job to finish (up to the
    profile's job timeout; ``gpuflow.triggers.settle``); a job killed with the task is stopped. With
    ``require_gpu``, a report without a GPU fails the task. A retry starts no second check: it waits on the one an
    earlier try started, found by the job's name (gcp: while it is active in Dataflow; local: its pid file, running
    or ended well).

    :param config_json: the validated configuration, ``PreflightOperator``'s result (``preflight.output``); or,
        in a team's DAG without a gpuflow configuration file, the plain arguments (``PlainArguments``) and:
    :param gpu_type: the GPU (``nvidia-l4``, ...; default nvidia-l4).
    :param gpu_count: GPUs per worker (default 1).
    :param machine_type: the workers' machine type (default g2-standard-4, the L4's).
    :param bucket: the bucket the check's job stages in and reports to (gcp).
    :param require_gpu: fail when the workers see no GPU (default False: report it).
    :param image: the worker image (a URI, or ``BuildContainerOperator``'s result); the local runner ignores it.
    """

    execution_timeout_from = "job_start"  # its execution_timeout: gpuflow.runs.task_timeouts

    job_arguments = {"gpu_type": "gpu.type", "gpu_count": "gpu.count", "machine_type": "gpu.machine_type",
                     "bucket": "bucket", "require_gpu": "require_gpu"}
    template_fields: Sequence[str] = ("config_json", "image", *PlainArguments.provider_arguments, *job_arguments,
                                      "poll_interval")

    def __init__(self, *, image: Any = None, gpu_type: str | None = None, gpu_count: int | str | None = None,
                 machine_type: str | None = None, bucket: str | None = None, require_gpu: bool | str | None = None,
                 **kwargs: Any) -> None:
        self.gpu_type, self.gpu_count, self.machine_type = gpu_type, gpu_count, machine_type
        self.bucket, self.require_gpu = bucket, require_gpu
        super().__init__(**kwargs)
        self.image = image

    def execute_step(self, config: GpuflowConfig, names: ResourceNames, platform: Platform, context: Any) -> Any:
        if not config.uses_gpu:
            log.info("gpu.type none: the workers run on CPU, so there is no GPU to check")
            return {"gpu_found": False, "skipped": "gpu.type none: CPU workers"}
        rollout = rollout_plan(context, config, names, platform.conn_id)
        if rollout is not None and rollout.path == "weights":
            log.info("only the weights change: the running job's workers were checked when it started")
            return {"gpu_found": None, "skipped": "weights only: the running job keeps its workers"}
        handle = platform.find_gpu_check(names)  # a retry waits on what its earlier try started
        if handle is not None:
            log.info("the GPU check %s (%s) that an earlier try started: waiting on it, not starting another",
                     handle.name, handle.id)
        else:
            handle = platform.start_gpu_check(names, _image_of(self.image))
        self.remember_job(platform, handle)
        return self.defer_on(context, config, platform, handle, "done")

    def execute_complete_step(self, config: GpuflowConfig, names: ResourceNames, platform: Platform, context: Any,
                              event: dict[str, Any], *, handle: JobHandle) -> Any:
        from gpuflow.steps.gpu import NoGpuOnWorkers, judge_gpu_report

        if not event_succeeded(event):
            platform.stop_pipeline(handle)
            raise AirflowException(f"the GPU check did not finish: {event.get('message')}")
        try:
            return judge_gpu_report(config, platform.gpu_check_report(names, handle))
        except NoGpuOnWorkers as error:
            raise AirflowFailException(str(error)) from None


class LaunchPipelineOperator(PlainArguments, JobWaitingOperator):
    """Starts the streaming pipeline, pushes its job handle at once, and waits, deferred, until its workers are up.

    local: beam_jobs/llm_inference.py as a detached process on the local runner. gcp: a Dataflow job (a staged
    template or a Flex Template), which counts as up once its workers have started. When the zone has no free GPUs
    (ZONE_RESOURCE_POOL_EXHAUSTED), the job is stopped and the next of ``gpu.fallbacks`` is started, each checked by
    preflight first. A lasting deployment's rollout switches the weights or updates the job in place instead.
    ``on_kill`` stops a job not yet deferred on (the trigger's, after). It defers at once: a job's start takes
    longer than a worker's short wait (``gpuflow.triggers.settle``). Not retried in gpuflow's DAGs (``retries=0``):
    a second try would start a second job; a failed launch leaves its job to the run's cleanup, which finds it by
    the run's prefix.

    :param config_json: the validated configuration, ``PreflightOperator``'s result (``preflight.output``); or,
        in a team's DAG without a gpuflow configuration file, the plain arguments (``PlainArguments``) and:
    :param image: the worker image (a URI, or ``BuildContainerOperator``'s result); the local runner ignores it.
    :param model: the model the pipeline serves (default: gpuflow's offline demo model, ``gpuflow-demo``).
    :param model_dir: the ``gs://`` folder its export lies in (``ExportModelOperator``'s ``model_dir``; default:
        under the run's prefix).
    :param bucket: the bucket the job stages in (default: the run's own, as ``SetupResourcesOperator`` made it).
    :param gpu_type: the workers' GPU (``nvidia-l4``, ...; default nvidia-l4; ``none``: CPU workers).
    :param gpu_count: GPUs per worker (default 1).
    :param machine_type: the workers' machine type (default g2-standard-4, the L4's).
    :param max_num_workers: the most workers the job may scale to (default 1).
    :param max_new_tokens: tokens generated per answer (default 16).
    """

    execution_timeout_from = "job_start"  # its execution_timeout: gpuflow.runs.task_timeouts

    ui_color = "#d4edda"
    operator_extra_links = (DataflowConsoleLink(),)
    batch = False  # the batch DAG's run_batch: a batch job, waited for until it is done

    job_arguments = {
        "model": "model.name", "model_dir": "export.model_dir", "bucket": "bucket", "gpu_type": "gpu.type",
        "gpu_count": "gpu.count", "machine_type": "gpu.machine_type", "max_num_workers": "worker.max_num_workers",
        "max_new_tokens": "model.max_new_tokens"}
    template_fields: Sequence[str] = ("config_json", "image", *PlainArguments.provider_arguments, *job_arguments,
                                      "poll_interval")

    def __init__(self, *, image: Any = None, model: str | None = None, model_dir: str | None = None,
                 bucket: str | None = None, gpu_type: str | None = None, gpu_count: int | str | None = None,
                 machine_type: str | None = None, max_num_workers: int | str | None = None,
                 max_new_tokens: int | str | None = None, **kwargs: Any) -> None:
        self.model, self.model_dir, self.bucket = model, model_dir, bucket
        self.gpu_type, self.gpu_count, self.machine_type = gpu_type, gpu_count, machine_type
        self.max_num_workers, self.max_new_tokens = max_num_workers, max_new_tokens
        super().__init__(**kwargs)
        self.image = image

    def execute_step(self, config: GpuflowConfig, names: ResourceNames, platform: Platform, context: Any) -> Any:
        rollout = None if self.batch else rollout_plan(context, config, names, platform.conn_id)
        if rollout is not None and rollout.path != "weights":  # a deployment's new job watches its pointer folder
            from gpuflow.steps.deployment import ensure_version_pointer

            ensure_version_pointer(config, names, platform, rollout.record)
        if rollout is not None and rollout.path in ("weights", "update"):
            return self._roll_out(config, names, platform, context, rollout)
        return self._start(config, names, context, after=0, failures=[])

    def _roll_out(self, config: GpuflowConfig, names: ResourceNames, platform: Platform, context: Any, rollout: RolloutPlan) -> Any:
        """A deployment's weights (the running job switches versions) or update (Dataflow replaces it in place)."""
        from gpuflow.steps.deployment import roll_out_weights, update_in_place

        if rollout.path == "weights":
            handle = roll_out_weights(config, names, platform, rollout)
            context["ti"].xcom_push(key=DataflowConsoleLink.source_key, value=handle.to_xcom())
            return handle.to_xcom()
        handle = update_in_place(config, names, platform, _image_of(self.image), rollout)
        self.remember_job(platform, handle)
        context["ti"].xcom_push(key=DataflowConsoleLink.source_key, value=handle.to_xcom())
        return self.defer_on(context, config, platform, handle, "running", placement=1, failures=[],
                             started=time.time())

    def _start(self, config: GpuflowConfig, names: ResourceNames, context: Any, after: int, failures: list[str]) -> Any:
        from gpuflow.platform import get_platform
        from gpuflow.steps.launch import start_next_placement
        from gpuflow.steps.placements import FallbacksExhausted
        from gpuflow.steps.quota import QuotaTooLow

        try:
            placement, handle = start_next_placement(config, names, _image_of(self.image), after, failures,
                                                     batch=self.batch)
        except (FallbacksExhausted, QuotaTooLow) as error:
            raise AirflowFailException(str(error)) from None
        platform = get_platform(placement.config)
        self.remember_job(platform, handle)
        context["ti"].xcom_push(key=DataflowConsoleLink.source_key, value=handle.to_xcom())
        until, timeout_s = ("done", platform.job_timeout_s("running") + config.batch.job_timeout_s) if self.batch \
            else ("running", None)
        return self.defer_on(context, placement.config, platform, handle, until, timeout_s,
                             placement=placement.number, failures=failures, started=time.time())

    def execute_complete_step(self, config: GpuflowConfig, names: ResourceNames, platform: Platform, context: Any,
                              event: dict[str, Any], *, handle: JobHandle, placement: int, failures: list[str],
                              started: float) -> Any:
        from gpuflow.steps.launch import after_failed_start

        if event_succeeded(event):
            log.info("%s", event.get("message"))
            if self.batch:  # the job's window: its summary's rates, and where to read its GPU usage
                return {"job": handle.to_xcom(), "window": [started, time.time()]}
            return handle.to_xcom()
        message = event.get("message") or "the job did not start"
        if after_failed_start(config, placement, handle, message, failures):
            return self._start(config, names, context, after=placement, failures=failures)
        raise AirflowException(message)


def _handle_of(job: Any) -> JobHandle | None:
    """A job handle from an XCom (an XComArg of a launch's result, or what it pushed), back from its JSON form;
    None for none."""
    from gpuflow.platform import JobHandle

    return JobHandle.model_validate(job) if job else None


def _pushed_handle(context: Any, launch_task_id: str) -> JobHandle | None:
    return _handle_of(context["ti"].xcom_pull(task_ids=launch_task_id, key=DataflowConsoleLink.source_key))


class GpuUsageCheck(JobWaitingOperator):
    """Checks that a job's GPUs really worked over a window; smoke_test.gpu_usage says fail, warn or ignore.

    local: nvidia-smi, read at once (it waits for nothing). gcp: Cloud Monitoring; the task waits, deferred, until
    the job's GPU metrics have arrived (they lag; up to ``smoke_test.gpu_usage_timeout_s``)."""

    execution_timeout_from = "gpu_usage"  # its execution_timeout: gpuflow.runs.task_timeouts

    def check_usage(self, context: Any, config: GpuflowConfig, platform: Platform, handle: JobHandle | None, window: list[float],
                    result: dict[str, Any]) -> Any:
        usage: dict[str, Any] | None
        if not config.uses_gpu:
            usage = {"source": "none", "note": "gpu.type none: CPU workers, no GPU to check"}
        else:
            usage = platform.gpu_usage(handle, *window)
        if usage is None and handle is not None:  # gcp: wait for Cloud Monitoring in the triggerer
            from gpuflow.triggers.monitoring import gpu_usage_trigger

            started, ended = window
            return self.wait_for(context, gpu_usage_trigger(config, handle.id, started, ended,
                                                            carried={"result": result}),
                                 config.smoke_test.gpu_usage_timeout_s)
        return self._checked(config, result, usage or {"source": "cloud-monitoring",
                                                       "note": "no Dataflow job handle: no job to read"})

    def execute_complete_step(self, config: GpuflowConfig, names: ResourceNames, platform: Platform, context: Any,
                              event: dict[str, Any], *, result: dict[str, Any] | None = None, **carry: Any) -> Any:
        return self._checked(config, result or {}, event["usage"])

    @staticmethod
    def _checked(config: GpuflowConfig, result: dict[str, Any], usage: dict[str, Any]) -> dict[str, Any]:
        from gpuflow.steps.smoke import NoGpuUsage, check_gpu_usage

        try:
            check_gpu_usage(config, usage)
        except NoGpuUsage as error:
            raise AirflowFailException(str(error)) from None
        return {**result, "gpu_usage": usage}


#: The smoke test's XCom of its round (``SmokeRound``: the prompts sent, the answers and dead letters received so
#: far), pushed before what was received is acknowledged: the answers are never only in Pub/Sub's hands or lost.
SMOKE_ANSWERS_KEY = "smoke_answers"


class SmokeTestOperator(PlainArguments, GpuUsageCheck):
    """Asks the pipeline questions, defers until each has its answer or dead letter (``gpuflow.triggers.answers``),
    then checks that its GPUs really worked over the questions' window.

    Both profiles publish ``smoke_test.num_prompts`` prompts to the run's (or deployment's) prompts topic; the
    triggerer waits up to ``smoke_test.timeout_s`` (a rollout: ``deployment.rollout_timeout_s``) and acknowledges
    nothing; the task keeps the answers in its XCom, then acknowledges them. gcp: the GPU usage comes from Cloud
    Monitoring (a second deferral); local: from nvidia-smi, where there is one.

    :param config_json: the validated configuration, ``PreflightOperator``'s result (``preflight.output``); or,
        in a team's DAG without a gpuflow configuration file, the plain arguments (``PlainArguments``) and:
    :param job_handle: the pipeline's job handle, ``LaunchPipelineOperator``'s result (``launch.output``).
    :param gpu_type: the workers' GPU, whose use is checked (default nvidia-l4; ``none``: CPU workers, no check).
    :param num_prompts: prompts published (default 8).
    """

    execution_timeout_from = "smoke_test"  # its execution_timeout: gpuflow.runs.task_timeouts
    job_arguments = {"gpu_type": "gpu.type", "num_prompts": "smoke_test.num_prompts"}
    template_fields: Sequence[str] = ("config_json", "job_handle", *PlainArguments.provider_arguments,
                                      *job_arguments, "poll_interval")

    def __init__(self, *, job_handle: Any = None, gpu_type: str | None = None, num_prompts: int | str | None = None,
                 **kwargs: Any) -> None:
        self.gpu_type, self.num_prompts = gpu_type, num_prompts
        super().__init__(**kwargs)
        self.job_handle = job_handle

    def execute_step(self, config: GpuflowConfig, names: ResourceNames, platform: Platform, context: Any) -> Any:
        from gpuflow.steps.smoke import start_smoke_test

        rollout = rollout_plan(context, config, names, platform.conn_id)
        state = start_smoke_test(config, names, platform.conn_id,
                                 expect_version=names.model_version if rollout is not None else None)
        return self._wait_for_answers(context, config, names, state)

    def _wait_for_answers(self, context: Any, config: GpuflowConfig, names: ResourceNames, state: SmokeRound) -> Any:
        from gpuflow.triggers.answers import smoke_answers_trigger

        # Straight to the trigger: a streaming job's first answers wait for its first batch, and what the trigger
        # pulls it hands on unacknowledged (a worker's short wait would leave them out until their ack deadline).
        trigger = smoke_answers_trigger(config, names, state, carried={"smoke": state.model_dump(mode="json")})
        return self.wait_for(context, trigger, max(0.0, state.deadline - time.time()), wait_first=False)

    def execute_complete_step(self, config: GpuflowConfig, names: ResourceNames, platform: Platform, context: Any,
                              event: dict[str, Any], *, smoke: dict[str, Any] | None = None, **carry: Any) -> Any:
        if smoke is None:  # back from the GPU-usage wait
            return super().execute_complete_step(config, names, platform, context, event, **carry)
        from gpuflow.steps.smoke import (
            SmokeRound,
            SmokeTestFailed,
            acknowledge,
            another_round_due,
            failed_pull,
            publish_round,
            record_answers,
            smoke_test_result,
        )

        state = SmokeRound.model_validate(smoke)
        acks = record_answers(state, event)
        # Kept first (the task's XCom), acknowledged second: a triggerer that died before this point lost nothing.
        context["ti"].xcom_push(key=SMOKE_ANSWERS_KEY, value=state.model_dump(mode="json"))
        acknowledge(config, platform.conn_id, acks)
        try:
            failed_pull(event)
            if another_round_due(state):
                time.sleep(min(config.deployment.refresh_interval_s, 10))  # the job's time to switch versions
                publish_round(config, names, platform.conn_id, state)
                return self._wait_for_answers(context, config, names, state)
            result = smoke_test_result(state)
        except SmokeTestFailed as error:
            raise AirflowException(str(error)) from None
        return self.check_usage(context, config, platform, _handle_of(self.job_handle), result["window"], result)


class CleanupOperator(PlainArguments, JobWaitingOperator):
    """Stops the run's jobs (by handle, and by the run's prefix), then deletes the run's resources. local: the
    pipeline processes are stopped at once; gcp: each Dataflow job is cancelled or drained, in the region and every
    fallback region, and the task waits, deferred, while it stops. The topics, subscriptions and bucket go through
    the provider's hooks on both. A persistent deployment's run first rolls back what it did not promote, and never
    stops the job the deployment serves on, nor deletes its topics, subscription or model.

    It deletes only what carries the run's names and labels (``gpuflow.runs.naming``), never a team's bucket or objects
    outside the run's prefix. Make it the teardown of the tasks that create (``cleanup.as_teardown(setups=...)``).

    :param config_json: the validated configuration, ``PreflightOperator``'s result (``preflight.output``); or,
        in a team's DAG without a gpuflow configuration file, the plain arguments (``PlainArguments``) and:
    :param launch_task_id: the task that pushed the pipeline's job handle, if any.
    :param bucket: the bucket the run's objects lie in, under its prefix, as ``SetupResourcesOperator`` was given
        it (default: the run's own bucket, which is deleted).
    """

    execution_timeout_from = "every_region_stops"  # its execution_timeout: gpuflow.runs.task_timeouts

    ui_color = "#f8d7da"
    job_arguments = {"bucket": "bucket"}
    template_fields: Sequence[str] = ("config_json", *PlainArguments.provider_arguments, "bucket", "poll_interval")

    def __init__(self, *, launch_task_id: str = LAUNCH_TASK, bucket: str | None = None, **kwargs: Any) -> None:
        self.bucket = bucket
        super().__init__(**kwargs)
        self.launch_task_id = launch_task_id

    def execute_step(self, config: GpuflowConfig, names: ResourceNames, platform: Platform, context: Any) -> Any:
        from gpuflow.steps.cleanup import request_stops

        pushed, keep = _pushed_handle(context, self.launch_task_id), None
        if names.deployment and (rollout := rollout_plan(context, config, names, platform.conn_id)) is not None:
            from gpuflow.platform.records import Records
            from gpuflow.steps.deployment import roll_back

            roll_back(config, names, platform, rollout, pushed, context["run_id"])
            serving = Records(config, platform.conn_id).read(names.deployment)
            keep = serving.job["id"] if serving else None
        stopping = request_stops(names, platform, pushed, keep=keep)
        return self._next(context, config, names, platform, [h.to_xcom() for h in stopping], [])

    def _next(self, context: Any, config: GpuflowConfig, names: ResourceNames, platform: Platform, stopping: list[dict[str, Any]],
              stopped: list[str]) -> Any:
        """Defer on the next job that is still stopping; once none is, delete the run's resources."""
        from gpuflow.platform import JobHandle

        while stopping:
            handle = JobHandle.model_validate(stopping.pop(0))
            stopped.append(handle.id)
            if handle.kind == "dataflow":  # local processes are stopped already
                return self.defer_on(context, config, platform, handle, "stopped", stopping=stopping, stopped=stopped)
        return self.delete_resources(context, config, names, platform, stopped)

    def delete_resources(self, context: Any, config: GpuflowConfig, names: ResourceNames, platform: Platform, stopped: list[str]) -> dict[str, Any]:
        """Once the run's jobs have stopped: what else of the run goes."""
        from gpuflow.steps.cleanup import delete_run_resources

        serving = None
        if names.deployment:
            from gpuflow.platform.records import Records

            serving = Records(config, platform.conn_id).read(names.deployment)
        return delete_run_resources(config, names, platform, stopped, serving=serving)

    def execute_complete_step(self, config: GpuflowConfig, names: ResourceNames, platform: Platform, context: Any,
                              event: dict[str, Any], *, handle: JobHandle, stopping: list[dict[str, Any]],
                              stopped: list[str]) -> Any:
        log.log(logging.INFO if event_succeeded(event) else logging.WARNING, "%s", event.get("message"))
        return self._next(context, config, names, platform, stopping, stopped)
