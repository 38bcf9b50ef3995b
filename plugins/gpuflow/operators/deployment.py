"""The operators of a persistent deployment: evaluate and promote (llm_streaming_inference), teardown
(llm_streaming_teardown) and the janitor (gpuflow_janitor)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gpuflow.operators.airflow_names import AirflowException, AirflowFailException
from gpuflow.operators.base import JobWaitingOperator, event_succeeded, rollout_plan
from gpuflow.operators.links import DataflowConsoleLink, RolloutGatePageLink
from gpuflow.operators.streaming import CleanupOperator, PreflightOperator, _handle_of, _image_of

if TYPE_CHECKING:
    from gpuflow.configuration.model import GpuflowConfig
    from gpuflow.platform import JobHandle, Platform
    from gpuflow.runs.naming import ResourceNames
    from gpuflow.steps.evaluation import EvalVersion

log = logging.getLogger(__name__)


class MaintenancePreflightOperator(PreflightOperator):
    """Preflight of the teardown and the janitor: the connection and the project (local: the emulators; gcp: the
    project's access), not the job's rules. It waits for nothing."""

    workflow = "maintenance"


class EvaluateOperator(JobWaitingOperator):
    """The rollout gate, before anything switches: the evaluation set (``rollout.eval_set``) runs through the
    serving version and the candidate on the same batches, in rounds (gcp: each a batch Dataflow job on the
    version's GPU type and image, both started at once; local: one process that holds both models and interleaves
    their batches, since two jobs would share this machine's processors), waited for deferred; then the candidate
    is promoted only if its mean score is within ``rollout.max_score_drop`` of the serving version's and the median
    of its per-batch latency ratios within ``rollout.max_latency_ratio`` (``gpuflow.runs.rollout_gate``). Refused,
    the task fails naming the bound and both figures, and nothing has switched: the launch never runs. A first
    deployment is scored against the set's references alone. Ephemeral runs, and a configuration without
    ``rollout.eval_set``, have no gate (the log says so). The decision goes to XCom (key ``rollout_gate``, pass or
    fail) and to a page in the deployment's folder (the "Rollout gate" link on gcp); promote keeps it in the
    deployment's record.

    :param config_json: the validated configuration, ``PreflightOperator``'s result (``preflight.output``).
    :param image: the candidate's worker image (``BuildContainerOperator``'s result).
    """

    execution_timeout_from = "evaluation"  # its execution_timeout: gpuflow.runs.task_timeouts

    ui_color = "#fff3cd"
    operator_extra_links = (DataflowConsoleLink(), RolloutGatePageLink())
    template_fields: Sequence[str] = ("config_json", "image")
    DECISION_KEY = "rollout_gate"

    def __init__(self, *, image: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.image = image

    def execute_step(self, config: GpuflowConfig, names: ResourceNames, platform: Platform, context: Any) -> Any:
        from gpuflow.configuration.model import ConfigError
        from gpuflow.steps.evaluation import evaluation_versions, read_eval_set

        rollout = rollout_plan(context, config, names, platform.conn_id)
        skipped = ("deployment.mode ephemeral: no lasting deployment to gate" if rollout is None else
                   None if config.rollout.eval_set else "no rollout.eval_set in the configuration file: no gate")
        if skipped or rollout is None:
            log.info("%s", skipped)
            return {"decision": "skipped", "why": skipped}
        try:
            prompts = read_eval_set(config, platform.conn_id)  # a bad set fails here, before any job starts
        except ConfigError as error:
            raise AirflowFailException(str(error)) from None
        if rollout.record is None and all(prompt.reference is None for prompt in prompts):
            skipped = ("a first deployment, and the evaluation set has no references: nothing to compare with, so "
                       "the gate is skipped")
            log.info("%s", skipped)
            return {"decision": "skipped", "why": skipped}
        self._versions = evaluation_versions(config, names, rollout, _image_of(self.image))
        # On Dataflow each version is a job with workers of its own, and a start takes minutes: all start at once.
        # Locally one process runs every version, interleaved (gpuflow.steps.evaluation.evaluation_jobs).
        jobs: list[dict[str, Any] | None] = [None] * len(self._jobs_of(context, config, names))
        self._started = []
        for number in range(len(jobs)):
            jobs[number] = self._start(context, config, names, number)
        return self._wait(context, config, names, jobs, number=0)

    _started: list[Any] = []  # (platform, job) of each evaluation job this task started in its process
    _versions: list[EvalVersion] = []  # what this process evaluates (the trigger's event resumes in a new one)

    def _versions_of(self, context: Any, config: GpuflowConfig, names: ResourceNames) -> list[EvalVersion]:
        """The versions to evaluate, from preflight's rollout plan (checked against the record), once a process."""
        from gpuflow.platform import get_platform
        from gpuflow.steps.evaluation import evaluation_versions

        if not self._versions:
            rollout = rollout_plan(context, config, names, get_platform(config).conn_id)
            assert rollout is not None  # (execute_step gates ephemeral runs out)
            self._versions = evaluation_versions(config, names, rollout, _image_of(self.image))
        return self._versions

    def _jobs_of(self, context: Any, config: GpuflowConfig, names: ResourceNames) -> list[list[EvalVersion]]:
        """The versions each evaluation job runs (gcp: one each; local: all in one)."""
        from gpuflow.steps.evaluation import evaluation_jobs

        return evaluation_jobs(config, self._versions_of(context, config, names))

    def _start(self, context: Any, config: GpuflowConfig, names: ResourceNames, number: int) -> dict[str, Any]:
        from gpuflow.platform import get_platform
        from gpuflow.steps.evaluation import start_job

        versions = self._jobs_of(context, config, names)[number]
        platform = get_platform(versions[0].config)  # the serving version's job on its own recorded hardware
        job = start_job(platform, versions, config).to_xcom()
        self._started = [*self._started, (platform, job)]
        context["ti"].xcom_push(key=DataflowConsoleLink.source_key, value=job)
        return job

    def on_kill(self) -> None:
        """Before the task defers, a kill stops every evaluation job it started (then the trigger stops the one it
        waits on, and the run's cleanup, a teardown, every other job of the run)."""
        from gpuflow.platform import JobHandle

        for platform, job in self._started if self.cancel_on_kill else []:
            platform.stop_pipeline(JobHandle.model_validate(job))

    def _wait(self, context: Any, config: GpuflowConfig, names: ResourceNames,
              jobs: list[dict[str, Any] | None], number: int) -> Any:
        """Wait, deferred, for evaluation job ``number`` (started now if it is not yet)."""
        from gpuflow.platform import JobHandle, get_platform

        job = jobs[number] or self._start(context, config, names, number)
        jobs = [*jobs[:number], job, *jobs[number + 1:]]
        version = self._jobs_of(context, config, names)[number][0]
        platform = get_platform(version.config)
        return self.defer_on(context, version.config, platform, JobHandle.model_validate(job), "done",
                             platform.job_timeout_s("running") + config.batch.job_timeout_s, number=number, jobs=jobs)

    def execute_complete_step(self, config: GpuflowConfig, names: ResourceNames, platform: Platform, context: Any,
                              event: dict[str, Any], *, handle: JobHandle, number: int,
                              jobs: list[dict[str, Any] | None]) -> Any:
        from gpuflow.steps.evaluation import gate, write_report

        if not event_succeeded(event):
            raise AirflowException(f"the evaluation job {handle.name} did not finish: {event.get('message')}. "
                                   "Nothing switched; the serving version keeps all traffic.")
        if number + 1 < len(jobs):
            return self._wait(context, config, names, jobs, number + 1)
        versions = self._versions_of(context, config, names)
        decision = gate(config, platform.conn_id, versions)
        result = decision.model_dump(mode="json")
        context["ti"].xcom_push(key=self.DECISION_KEY, value=result)
        page, console = write_report(config, platform.conn_id, names, decision, context["run_id"])
        context["ti"].xcom_push(key=RolloutGatePageLink.source_key, value=console)
        log.info("the rollout gate's page: %s", page)
        if decision.refused:  # (only against a serving version, the first evaluated)
            raise AirflowFailException(
                f"rollout of {names.model_version} to deployment {names.deployment} refused: {decision.why}. "
                f"Nothing switched: {versions[0].names.model_version} keeps all traffic. Fix: a better candidate, or "
                "wider bounds (rollout.max_score_drop, rollout.max_latency_ratio) in the configuration file.")
        return result


class PromoteOperator(JobWaitingOperator):
    """The new version answered the smoke test: record it as the deployment's state (the record names its job, its
    image and its model version), and drain the job it replaced. Ephemeral runs have nothing to promote.
    The record lies in the bucket on both profiles (local: the storage emulator); the replaced job is stopped as
    cleanup stops one (local: its process; gcp: a Dataflow drain, waited for deferred).

    :param config_json: the validated configuration, ``PreflightOperator``'s result (``preflight.output``).
    :param image: the worker image the new version runs (``BuildContainerOperator``'s result), for the record.
    :param job_handle: the new version's job handle, ``LaunchPipelineOperator``'s result (``launch.output``).
    :param evaluation: the rollout gate's decision, ``EvaluateOperator``'s result (``evaluate.output``), kept in the
        record.
    """

    execution_timeout_from = "job_stop"  # its execution_timeout: gpuflow.runs.task_timeouts

    ui_color = "#d4edda"
    operator_extra_links = (DataflowConsoleLink(),)
    template_fields: Sequence[str] = ("config_json", "image", "job_handle", "evaluation")

    def __init__(self, *, image: Any = None, job_handle: Any = None, evaluation: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.image, self.job_handle, self.evaluation = image, job_handle, evaluation

    def execute_step(self, config: GpuflowConfig, names: ResourceNames, platform: Platform, context: Any) -> Any:
        from gpuflow.steps.deployment import after_replaced_job, promote

        rollout = rollout_plan(context, config, names, platform.conn_id)
        if rollout is None:
            log.info("deployment.mode ephemeral: nothing to promote; cleanup deletes what the run made")
            return {"skipped": "deployment.mode ephemeral"}
        handle = _handle_of(self.job_handle)
        if handle is None:
            raise AirflowException("no job handle (job_handle: the launch's result): nothing to promote")
        context["ti"].xcom_push(key=DataflowConsoleLink.source_key, value=handle.to_xcom())
        result = {"deployment": names.deployment, "path": rollout.path, "why": rollout.why,
                  "model_version": names.model_version, "job": handle.to_xcom()}
        gated = self.evaluation if isinstance(self.evaluation, dict) and self.evaluation.get("candidate") else None
        draining = promote(config, names, platform, rollout, handle, _image_of(self.image), context["run_id"],
                           evaluation=gated)
        if draining is not None and draining.kind == "dataflow":
            return self.defer_on(context, config, platform, draining, "stopped", result=result)
        return {**result, "replaced": draining.to_xcom() if draining else None,
                "deleted_subscriptions": after_replaced_job(config, names, platform, rollout)}

    def execute_complete_step(self, config: GpuflowConfig, names: ResourceNames, platform: Platform, context: Any,
                              event: dict[str, Any], *, handle: JobHandle, result: dict[str, Any]) -> Any:
        from gpuflow.steps.deployment import after_replaced_job

        log.log(logging.INFO if event_succeeded(event) else logging.WARNING, "replaced job %s: %s", handle.name,
                event.get("message"))
        rollout = rollout_plan(context, config, names, platform.conn_id)
        if rollout is None:  # promote defers only on a persistent run's plan, which rollout_plan checked again
            raise AirflowFailException("this run's rollout plan is gone since promote deferred. Fix: trigger a new run.")
        return {**result, "replaced": handle.to_xcom(),
                "deleted_subscriptions": after_replaced_job(config, names, platform, rollout)}


class TeardownOperator(CleanupOperator):
    """Stops a deployment's job (drain or cancel: dataflow.stop_action), then deletes its subscriptions, topics,
    model folder and record. local: the pipeline process is stopped at once; gcp: the task waits, deferred, while
    Dataflow stops the job."""

    takes_plain_arguments = False  # a gpuflow configuration only

    execution_timeout_from = "job_stop"  # its execution_timeout: gpuflow.runs.task_timeouts

    def execute_step(self, config: GpuflowConfig, names: ResourceNames, platform: Platform, context: Any) -> Any:
        from gpuflow.platform import JobHandle
        from gpuflow.platform.records import Records
        from gpuflow.runs.naming import DEPLOYMENT_LABEL, deployment_name
        from gpuflow.runs.rollout import owner_problem

        name = deployment_name(config)
        record = Records(config, platform.conn_id).read(name)
        problem = owner_problem(record, config, "tear down")
        if problem:
            raise AirflowFailException(problem + " Nothing was stopped or deleted.")
        log.info("deployment %s: %s", name, f"recorded, job {record.job_name} ({record.job['id']}), model version "
                 f"{record.model_version}" if record else "no record (stopping only what is labelled as its own)")
        # Its recorded job, and every job labelled as the deployment's: a name proves nothing (prod's prefix also
        # starts prod-eu's job names).
        jobs = {job.id: job for job in platform.find_gpuflow_jobs()
                if platform.job_labels(job).get(DEPLOYMENT_LABEL) == name}
        if record:
            jobs[record.job["id"]] = JobHandle.model_validate(record.job)
        stopping = [job for job in jobs.values() if platform.request_stop(job)]
        return self._next(context, config, names, platform, [job.to_xcom() for job in stopping], [])

    def delete_resources(self, context: Any, config: GpuflowConfig, names: ResourceNames, platform: Platform, stopped: list[str]) -> dict[str, Any]:
        from gpuflow.runs.naming import deployment_name
        from gpuflow.steps.deployment import tear_down

        return tear_down(config, platform, deployment_name(config), stopped)


class JanitorOperator(CleanupOperator):
    """Finds what gpuflow left behind that no running DAG run and no recorded deployment owns, and deletes it
    (janitor.dry_run: lists it). Leftover jobs are cancelled first: local pipeline processes at once; on gcp the
    task waits, deferred, while Dataflow stops them."""

    takes_plain_arguments = False  # a gpuflow configuration only

    LEFTOVERS_KEY = "gpuflow_leftovers"

    def execute_step(self, config: GpuflowConfig, names: ResourceNames, platform: Platform, context: Any) -> Any:
        from gpuflow.platform import JobHandle
        from gpuflow.steps.janitor import describe, find_leftovers

        leftovers = find_leftovers(config, platform, context["ti"].get_dagrun_state)
        log.info("the janitor found what no running DAG run and no recorded deployment owns:\n%s",
                 describe(leftovers))
        if config.janitor.dry_run:
            log.info("janitor.dry_run: nothing deleted")
            return {"dry_run": True, **leftovers}
        context["ti"].xcom_push(key=self.LEFTOVERS_KEY, value=leftovers)
        jobs = [JobHandle.model_validate(job) for job in leftovers["jobs"]]
        stopping = [job for job in jobs if platform.request_stop(job, drain=False)]
        return self._next(context, config, names, platform, [job.to_xcom() for job in stopping], [])

    def delete_resources(self, context: Any, config: GpuflowConfig, names: ResourceNames, platform: Platform, stopped: list[str]) -> dict[str, Any]:
        from gpuflow.steps.janitor import clean_up

        leftovers = context["ti"].xcom_pull(task_ids=self.task_id, key=self.LEFTOVERS_KEY)
        clean_up(config, platform, leftovers)
        log.info("the janitor deleted all of it (jobs stopped: %s)", stopped or "none")
        return {"dry_run": False, "stopped_jobs": stopped, **leftovers}
