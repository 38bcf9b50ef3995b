"""What every gpuflow operator shares: the run's configuration from its Params, run-scoped names, and the
step operator that runs one step in the profile's environment (console links: ``gpuflow.operators.links``).

Importing the operators is cheap: the steps, and through them torch, Beam and the Google clients, are imported
inside ``execute``, never when Airflow parses a DAG file. Each DAG file imports only its own module.
"""

from __future__ import annotations

import logging
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from gpuflow.trigger_form import run_settings

log = logging.getLogger(__name__)


def config_from_params(context: Any):
    """The run's configuration: its config file, then its Params. A bad one fails the task without retries."""
    from gpuflow.config import ConfigError, load_config

    config_file, changed, lines = run_settings(context["dag"].dag_id, dict(context["params"]))
    try:
        return load_config(config_file, changed, lines)
    except ConfigError as error:
        raise AirflowFailException(str(error)) from None


def validated_config(config, context: Any, workflow: str, what: str, zones_offering=None) -> dict[str, Any]:
    """Run preflight's rules for the workflow and log them; return the config as JSON for the next tasks.

    A finding at error level fails the task without retries: a bad configuration will not get better. So does a
    run whose waits would outlast their tasks' execution_timeout (killed mid-wait instead of ending with the
    reason); the execution timeouts come from the DAG's configuration file (``gpuflow.task_timeouts``)."""
    from gpuflow.preflight import PreflightFailed, format_findings, has_errors, run_preflight
    from gpuflow.task_timeouts import too_short_for

    short = too_short_for(config, context["dag"])
    if short:
        raise AirflowFailException(
            "this run's timeouts exceed what its tasks may run (their execution_timeout comes from the DAG's "
            f"configuration file): {'; '.join(short)}. Fix: raise the timeouts in the configuration file the DAG "
            "reads, or lower them for this run.")
    findings = run_preflight(config, workflow=workflow, zones_offering=zones_offering)
    log.info("preflight of %s:\n%s", what, format_findings(findings))
    if has_errors(findings):
        raise AirflowFailException(str(PreflightFailed(findings)))
    return config.model_dump(mode="json")


def names_for(context: Any, config):
    from gpuflow.naming import resource_names, run_prefix

    return resource_names(config, run_prefix(context["dag"].dag_id, context["run_id"]))


class GpuflowStepOperator(BaseOperator):
    """Rebuilds the validated config from the preflight task's XCom and runs one step in the profile's environment."""

    template_fields = ("config_json", "image")
    ui_color = "#e8f4fd"

    # The one __init__ of all step operators, with the few step-specific arguments: Airflow merges the DAG's
    # defaults once per __init__ in the class chain, and every merge counts at DAG parse time.
    def __init__(self, *, config_json: Any = None, image: Any = None, launch_task_id: str = "launch", **kwargs: Any):
        super().__init__(**kwargs)
        self.config_json = config_json
        self.image = image  # verify_gpu: build_container's result
        self.launch_task_id = launch_task_id  # cleanup: where the job handle was pushed

    def execute(self, context: Any) -> Any:
        from gpuflow.config import config_from_json
        from gpuflow.platform import get_platform

        config = config_from_json(self.config_json)
        names = names_for(context, config)
        platform = get_platform(config)
        with platform.environment():
            return self.run_step(config, names, platform, context)

    def run_step(self, config, names, platform, context: Any) -> Any:
        raise NotImplementedError
