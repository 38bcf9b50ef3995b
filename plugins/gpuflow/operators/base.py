"""What every gpuflow operator shares: the run's configuration from its Params, run-scoped names, and the
step operator that runs one step in the profile's environment (console links: ``gpuflow.operators.links``).

Importing the operators is cheap: the steps, and through them torch, Beam and the Google clients, are imported
inside ``execute``, never when Airflow parses a DAG file. Each DAG file imports only its own module. (The
Dataproc batch and the batch's input sensor extend the provider's operators, whose modules their DAG files name, so
that the dag-processor imports them once, before it forks each parse.)
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from gpuflow.operators.airflow_names import AirflowException, AirflowFailException
from gpuflow.workflow_names import GPU_POOL, PREFLIGHT_TASK

if TYPE_CHECKING:
    from datetime import timedelta

    from gpuflow.configuration.model import GpuflowConfig
    from gpuflow.platform import JobHandle, Platform
    from gpuflow.preflight.findings import Finding
    from gpuflow.runs.naming import ResourceNames
    from gpuflow.runs.rollout import RolloutPlan

log = logging.getLogger(__name__)


def validated_config(config: GpuflowConfig, context: Any, workflow: str, what: str) -> dict[str, Any]:
    """Run preflight's rules for the workflow and log them; return the config as JSON for the next tasks.

    The profile's platform adds what only it can read: on gcp, the region's zones from Compute Engine and the
    project's access (APIs, IAM, the workers' service account, policies, the bucket), before anything is created.
    On Cloud Composer, the GPU tasks' pool is read from the environment's Airflow REST API, and the environment's
    image and triggerer from Composer's environments API.

    A finding at error level fails the task without retries: a bad configuration will not get better. So does a
    run whose waits would outlast their tasks' execution_timeout (killed mid-wait instead of ending with the
    reason); the execution timeouts come from the DAG's configuration file (``gpuflow.runs.task_timeouts``)."""
    from gpuflow.preflight import run_preflight
    from gpuflow.runs.task_timeouts import too_short_for

    log.info("configuration: %s (profile %s, project %s, region %s)", config.source_file, config.profile,
             config.project, config.region)

    short = too_short_for(config, context["dag"])
    if short:
        raise AirflowFailException(
            "this run's timeouts exceed what its tasks may run (their execution_timeout comes from the DAG's "
            f"configuration file): {'; '.join(short)}. Fix: raise the timeouts in the configuration file the DAG "
            "reads, or lower them for this run.")
    from gpuflow.composer.api import environment_facts, pool_state, this_environment
    from gpuflow.platform import get_platform

    platform = get_platform(config)
    composer = this_environment(**config.hook_identity())  # on Composer: its Airflow's pools, its image, its triggerer
    gpu_pool = (GPU_POOL, lambda name: pool_state(composer, name)) if composer else None
    findings = run_preflight(config, workflow=workflow, zones_offering=platform.zones_offering,
                             access=platform.access_probe(), gpu_pool=gpu_pool,
                             composer_environment={**environment_facts(composer), **task_deferrals(context["dag"])}
                             if composer else None)
    fail_on_errors(findings, f"preflight of {what}")
    dumped: dict[str, Any] = config.model_dump(mode="json")
    return dumped


def task_deferrals(dag: Any) -> dict[str, list[str]]:
    """Which of the DAG's tasks defer while their jobs run, and which wait in their worker slots: each task's
    ``deferrable`` as parsed (gpuflow's waiting operators and the provider's have one)."""
    waiting = [task for task in dag.tasks if isinstance(getattr(task, "deferrable", None), bool)]
    return {"deferring_tasks": sorted(task.task_id for task in waiting if task.deferrable),
            "worker_waiting_tasks": sorted(task.task_id for task in waiting if not task.deferrable)}


def fail_on_errors(findings: list[Finding], what: str) -> None:
    """Log the findings; any at error level fails the task without retries (nothing has been created)."""
    from gpuflow.preflight import PreflightFailed, format_findings, has_errors

    log.info("%s:\n%s", what, format_findings(findings))
    if has_errors(findings):
        raise AirflowFailException(str(PreflightFailed(findings)))


def names_for(context: Any, config: GpuflowConfig) -> ResourceNames:
    from gpuflow.runs.naming import resource_names, run_prefix

    return resource_names(config, run_prefix(context["dag"].dag_id, context["run_id"]))


#: The XCom (of the preflight task) that carries a persistent deployment's rollout plan.
ROLLOUT_KEY = "gpuflow_rollout"


def rollout_plan(context: Any, config: GpuflowConfig, names: ResourceNames, conn_id: str) -> RolloutPlan | None:
    """This run's rollout plan (``gpuflow.runs.rollout.RolloutPlan``), or None when the run is ephemeral.

    Preflight's XCom, checked as the configuration is (``trusted_config``): a plan the XCom carries must be of this
    run's deployment, and what it says served before must be what the deployment's record says now, unless this run
    changed the record since (promote, or a rollback). An XCom edited to point a task at another job, or deleted to
    make a persistent run clean up as an ephemeral one would, is refused: the task does nothing."""
    from gpuflow.platform.records import Records
    from gpuflow.runs.rollout import RolloutPlan
    from gpuflow.steps.deployment import rolled_back_update

    pushed = context["ti"].xcom_pull(task_ids=PREFLIGHT_TASK, key=ROLLOUT_KEY)
    # A lasting deployment's run: its preflight plans the rollout (the batch DAG's preflight plans none)
    preflight = getattr(context.get("dag"), "task_dict", {}).get(PREFLIGHT_TASK)
    persistent = config.deployment.mode == "persistent" and getattr(preflight, "workflow", None) == "inference"
    if not pushed and not persistent:
        return None
    refused = "preflight's rollout plan (its XCom {key!r}) {why}. This task did nothing. Fix: trigger a new run."
    if not pushed:
        raise AirflowFailException(refused.format(key=ROLLOUT_KEY, why="is missing from a persistent run"))
    plan = RolloutPlan.model_validate(pushed)
    if not persistent:
        raise AirflowFailException(refused.format(key=ROLLOUT_KEY, why="is there, but this run is ephemeral"))
    if plan.record is not None:
        stored = Records(config, conn_id).read(names.serving)
        # this run changed it since: promoted its version, or undid its update (a retry of cleanup reads that)
        ours = stored is not None and (stored.changed_by == context["run_id"] or
                                       plan.path == "update" and rolled_back_update(stored, plan.record))
        if plan.record.name != names.serving or (stored != plan.record and not ours):
            raise AirflowFailException(refused.format(
                key=ROLLOUT_KEY, why=f"does not match deployment {names.serving}'s record"))
    return plan


#: How long after a trigger's own timeout Airflow's deferral timeout fails the task (``wait_for``).
DEFERRAL_BACKSTOP_S = 300


def deferral_timeout(timeout_s: float) -> timedelta:
    """Airflow's deferral timeout for a trigger that ends its own wait after ``timeout_s`` (see ``wait_for``)."""
    from datetime import timedelta

    return timedelta(seconds=timeout_s + DEFERRAL_BACKSTOP_S)


def deferrable_or_site_default(deferrable: bool | None) -> bool:
    """An operator's ``deferrable``; None: Airflow's ``[operators] default_deferrable``, as the provider's operators
    read it, but when the task is built rather than in a signature's default, so that a site's setting made after
    gpuflow's modules were imported counts."""
    if deferrable is not None:
        return deferrable
    from airflow.providers.common.compat.sdk import conf

    return bool(conf.getboolean("operators", "default_deferrable", fallback=False))


def event_succeeded(event: dict[str, Any] | None) -> bool:
    """A trigger's event says its job got where the task waited for (gpuflow's triggers and the provider's)."""
    return event is not None and event.get("status") == "success"


class GpuflowStepOperator(BaseOperator):
    """Rebuilds the validated config from the preflight task's XCom and runs one step in the profile's environment.
    A step that waits for nothing (``execute_step``) takes its configuration and nothing else; one that waits on a
    job is a ``JobWaitingOperator``.

    :param config_json: the validated configuration, ``PreflightOperator``'s result (``preflight.output``).
    """

    template_fields: Sequence[str] = ("config_json",)
    ui_color = "#e8f4fd"

    def __init__(self, *, config_json: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.config_json = config_json

    def trusted_config(self, context: Any) -> GpuflowConfig:
        from gpuflow.operators.run_config import trusted_config

        return trusted_config(self, self.config_json, context)

    def _in_platform(self, context: Any, step: Any, **kwargs: Any) -> Any:
        from gpuflow.platform import get_platform

        config = self.trusted_config(context)
        names = names_for(context, config)
        platform = get_platform(config)
        with platform.environment():
            return step(config, names, platform, context, **kwargs)

    def execute(self, context: Any) -> Any:
        return self._in_platform(context, self.execute_step)

    def execute_step(self, config: GpuflowConfig, names: ResourceNames, platform: Any, context: Any) -> Any:
        raise NotImplementedError


class PlainArguments(GpuflowStepOperator):
    """A step a team may run in its own DAG without a gpuflow configuration file: given the provider's arguments
    and the operator's own job arguments (``job_arguments``: argument -> configuration key) instead of
    ``config_json``, it acts on gpuflow's defaults with them set, validated when the task runs (templates
    rendered). The two ways exclude each other.

    :param project_id: the Google Cloud project (gcp).
    :param region: the region the jobs run in (default us-central1).
    :param gcp_conn_id: the Airflow connection to Google Cloud (default google_cloud_default).
    :param impersonation_chain: service accounts to act as, the last one acting (the provider's chain).
    :param profile: ``gcp`` (the default) or ``local``, gpuflow's offline profile (local runner, emulators): it
        reaches the emulators that ``PUBSUB_EMULATOR_HOST`` and ``STORAGE_EMULATOR_HOST`` name, as Google's client
        libraries read them and ``gpuflow emulators run`` sets them, else gpuflow's default ports.
    """

    #: The operator's own job arguments, by the configuration key each sets (a subclass sets them on itself before
    #: it calls this __init__, which refuses them beside config_json).
    job_arguments: dict[str, str] = {}
    #: False: a subclass that acts on a gpuflow configuration only (a batch run's filled paths, a deployment's
    #: record), which refuses plain arguments.
    takes_plain_arguments = True
    #: The provider's arguments, by the configuration key each sets.
    provider_arguments = {"project_id": "project", "region": "region", "gcp_conn_id": "gcp_conn_id",
                          "impersonation_chain": "impersonation_chain", "profile": "profile"}

    def __init__(self, *, project_id: str | None = None, region: str | None = None, gcp_conn_id: str | None = None,
                 impersonation_chain: str | Sequence[str] | None = None, profile: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.project_id, self.region, self.gcp_conn_id = project_id, region, gcp_conn_id
        self.impersonation_chain, self.profile = impersonation_chain, profile
        given = sorted(name for name in self._plain() if getattr(self, name) is not None)
        if not self.takes_plain_arguments and given:
            raise TypeError(f"{type(self).__name__} (task {self.task_id}) takes config_json (a gpuflow configuration), "
                            f"not plain arguments: {', '.join(given)} given")
        if self.config_json is not None and given:
            raise TypeError(f"{type(self).__name__} (task {self.task_id}) takes config_json (a gpuflow "
                            f"configuration) or plain arguments, not both: {', '.join(given)} given beside it")

    def _plain(self) -> dict[str, str]:
        """Every plain argument, by the configuration key it sets."""
        return {**self.provider_arguments, **self.job_arguments}

    def trusted_config(self, context: Any) -> GpuflowConfig:
        if self.config_json is not None:
            return super().trusted_config(context)
        from gpuflow.configuration.loading import config_from_settings
        from gpuflow.configuration.model import ConfigError

        plain = self._plain()
        chain = self.impersonation_chain
        values = {key: getattr(self, name) for name, key in plain.items()}
        values["impersonation_chain"] = [chain] if isinstance(chain, str) else chain
        values["profile"] = self.profile or "gcp"
        # A waiting operator's poll interval is the configuration's too: every trigger the task builds polls at it.
        values["dataflow.poll_interval_s"] = getattr(self, "poll_interval", None)
        if values["profile"] == "local":  # the worker's own environment, never a run's conf
            values["local.pubsub_emulator_host"] = os.environ.get("PUBSUB_EMULATOR_HOST")
            values["local.storage_emulator_host"] = os.environ.get("STORAGE_EMULATOR_HOST")
        if values["profile"] == "gcp" and not self.project_id:
            raise AirflowFailException(f"{type(self).__name__} (task {self.task_id}) was given neither config_json "
                                       "nor project_id. Fix: pass project_id (the Google Cloud project), or "
                                       "profile='local' for gpuflow's offline profile.")
        names = {key: name for name, key in plain.items()} | {"dataflow.poll_interval_s": "poll_interval"}
        try:
            config = config_from_settings(values, f"{type(self).__name__}'s arguments, task {self.task_id}",
                                          names=names)
        except ConfigError as error:
            raise AirflowFailException(str(error)) from None
        from gpuflow.preflight.limit_rules import limit_findings

        # No preflight runs here: the site's limits (gpuflow's defaults) still bound the arguments, as preflight would.
        refused = [finding for finding in limit_findings(config, "inference") if finding.level == "error"]
        if refused:
            raise AirflowFailException(f"{type(self).__name__} (task {self.task_id}): " + "; ".join(
                f"{names.get(f.field, f.field)} ({f.field}): {f.problem}. Fix: {f.fix}" for f in refused))
        return config


class JobWaitingOperator(GpuflowStepOperator):
    """A step that starts a job, or waits on one: its ``execute_step`` starts the job, remembers it for ``on_kill``,
    pushes its link, then waits (``defer_on``, ``wait_for``): deferred, Airflow calls ``execute_complete`` with the
    trigger's event, and no worker slot is held while Google (or the local pipeline process) works. What the step
    needs then comes back in the event (the trigger's ``carried``), and ``execute_complete_step`` goes on.

    :param config_json: the validated configuration, ``PreflightOperator``'s result (``preflight.output``).
    :param deferrable: defer while a job runs: the triggerer waits, the worker slot is free. False: the task waits
        in its worker slot, with the same trigger, then goes on as it would after the deferral; for an Airflow
        without a triggerer. Its execution_timeout already covers the wait. None (the default): Airflow's
        ``[operators] default_deferrable``, read when the DAG is parsed, as the provider's operators read it.
    :param poll_interval: seconds between a job trigger's polls of the job; None: ``dataflow.poll_interval_s``.
        With plain arguments (``PlainArguments``), it is ``dataflow.poll_interval_s``, and templated.
    :param cancel_on_kill: stop the task's job when the task is killed (the default), deferred or not. False: a
        killed task leaves its job running; the run's cleanup task, or the janitor, stops it later.
    """

    _platform: Any = None
    _job: Any = None  # the job this task started and still runs in its process: on_kill stops it

    def __init__(self, *, deferrable: bool | None = None, poll_interval: float | str | None = None,
                 cancel_on_kill: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.deferrable = deferrable_or_site_default(deferrable)
        self.poll_interval, self.cancel_on_kill = poll_interval, cancel_on_kill

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> Any:
        """Where the step goes on after its wait: the trigger's event, and what the step carried through the wait
        (the event's ``carried``, echoed by the trigger) as ``execute_complete_step``'s keyword arguments."""
        from gpuflow.platform import JobHandle

        event = dict(event or {})
        carried = dict(event.pop("carried", None) or {})
        if carried.get("handle"):  # defer_on's job handle, back from its JSON form
            carried["handle"] = JobHandle.model_validate(carried["handle"])
        return self._in_platform(context, self.execute_complete_step, event=event, **carried)

    #: Where a step goes on after its wait: (config, names, platform, context, event, **what it carried), each
    #: operator naming what it carries as keyword-only parameters.
    execute_complete_step: Callable[..., Any]

    def remember_job(self, platform: Platform, handle: JobHandle) -> None:
        """The job this task just started: ``on_kill`` stops it until the task defers (then the trigger's does)."""
        self._platform, self._job = platform, handle

    def on_kill(self) -> None:
        if self.cancel_on_kill and self._platform is not None and self._job is not None:
            log.info("task killed: stopping %s %s", self._job.kind, self._job.name)
            self.stop_job(self._platform, self._job)

    def stop_job(self, platform: Platform, handle: JobHandle) -> None:
        """How this step stops its job on kill: a Dataflow job or pipeline process by default."""
        platform.stop_pipeline(handle)

    def wait_on_started_job(self, context: Any, config: GpuflowConfig, platform: Platform, job: dict[str, Any],
                            link: Any, timeout_s: float, **carried: Any) -> Any:
        """A job the step has just started remotely (the export, the build): remember it, push its console link
        (``link.source_key``), and wait until it is done."""
        from gpuflow.platform import JobHandle

        handle = JobHandle.model_validate(job)
        self.remember_job(platform, handle)
        context["ti"].xcom_push(key=link.source_key, value=handle.url)
        return self.defer_on(context, config, platform, handle, "done", timeout_s, **carried)

    def defer_on(self, context: Any, config: GpuflowConfig, platform: Platform, handle: JobHandle, until: str,
                 timeout_s: float | None = None, **carried: Any) -> Any:
        """Wait until the job of ``handle`` reaches ``until`` (running, done or stopped); ``execute_complete_step``
        then gets the trigger's event, the handle and ``carried``."""
        from gpuflow.triggers import job_trigger

        seconds = timeout_s if timeout_s is not None else platform.job_timeout_s(until)
        # A job's start (a model that loads; on Dataflow, GPU workers and the image pull) takes longer than the
        # worker's short wait: straight to the trigger. A job's end or stop may come within seconds.
        wait_first = until != "running"
        log.info("%s until %s %s is %s (up to %.0fs)", "waiting" if wait_first else "deferring", handle.kind,
                 handle.name, until, seconds)
        poll_interval_s = None if self.poll_interval is None else float(self.poll_interval)  # templated: text
        trigger = job_trigger(config, handle, until, seconds, poll_interval_s=poll_interval_s,
                              cancel_on_kill=self.cancel_on_kill, carried={"handle": handle.to_xcom(), **carried})
        return self.wait_for(context, trigger, seconds, wait_first=wait_first)

    def wait_for(self, context: Any, trigger: Any, timeout_s: float, wait_first: bool = True) -> Any:
        """Defer to ``trigger``: Airflow calls ``execute_complete`` with its event. With ``deferrable=False``, the
        same trigger is waited for in this worker and ``execute_complete`` is called here: not the hooks' synchronous
        waits, which neither end at a bound of their own nor cancel the job, and on Dataflow read job states only (no
        workers-started check, no zone-exhaustion fail-fast); Cloud Build's has no wait by build id
        (tests/unit/test_provider_gaps.py). So both modes send the same requests and end the same way.

        ``wait_first``: wait up to ``HOLD_S`` for the event in this worker first, and go on without deferring when it
        comes: a job done within seconds (a GPU check, a stop) never defers, so it never meets Airflow's defer-exit
        race (``gpuflow.triggers.settle``), whose window the trigger would hold its event through anyway. A wait that
        cannot end that soon (a pipeline's start, the smoke test's answers) goes straight to the trigger."""
        # Two bounds on a deferred wait, each with its own job (Airflow 3.3.2):
        # - the trigger's own timeout (``timeout_s``) ends the wait with the reason, and cancels the job it waited
        #   on: when Airflow's trigger timeout fires instead, the triggerer cancels the trigger "without calling
        #   on_kill()" (airflow/jobs/triggerer_job_runner.py), which would leave the job billing;
        # - ``defer(timeout=…)``, DEFERRAL_BACKSTOP_S later, for a trigger that never answers (a triggerer gone for
        #   good). It is the only bound Airflow keeps while a task is deferred: the execution API does not apply the
        #   task's execution_timeout to a deferral (its "TODO: HANDLE execution timeout later",
        #   routes/task_instances.py).
        # execution_timeout (gpuflow.runs.task_timeouts) bounds the task's running parts, before and after the wait
        # (and the wait too, where the task waits in its worker: deferrable=False).
        if not self.deferrable:
            return self.execute_complete(context, self.wait_for_event(trigger, deferral_timeout(timeout_s)))
        event = self.event_within_hold(trigger) if wait_first else None
        if event is not None:
            return self.execute_complete(context, event)
        self.defer(trigger=trigger, method_name="execute_complete", timeout=deferral_timeout(timeout_s))

    @staticmethod
    def wait_for_event(trigger: Any, timeout: timedelta) -> dict[str, Any]:
        """``deferrable=False``: the trigger's event, waited for in this worker (``timeout``: Airflow's deferral
        timeout, the backstop above the trigger's own)."""
        from gpuflow.triggers import event_in_worker

        seconds = timeout.total_seconds()
        log.info("deferrable=False: waiting in the worker for %s (up to %.0fs)", type(trigger).__name__, seconds)
        try:
            return event_in_worker(trigger, seconds)
        except TimeoutError:
            raise AirflowException(f"{type(trigger).__name__} gave no event within {seconds:.0f}s") from None

    @staticmethod
    def event_within_hold(trigger: Any) -> dict[str, Any] | None:
        """The trigger's event if it comes within ``HOLD_S``, waited for in this worker; else None (then defer)."""
        from gpuflow.triggers import event_in_worker
        from gpuflow.triggers.settle import HOLD_S

        if HOLD_S <= 0:
            return None
        try:
            event = event_in_worker(trigger, HOLD_S)
        except TimeoutError:
            return None
        log.info("%s answered within %.0fs: going on in this worker, without deferring", type(trigger).__name__,
                 HOLD_S)
        return event
