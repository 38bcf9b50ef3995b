"""The run's configuration: what a preflight derives from the configuration file and the run's conf, and what
every later task derives again and compares with preflight's XCom (``trusted_config``), so that an XCom edited after
preflight acts on nothing. Shared by every gpuflow task; the preflight operators mix in ``DerivesRunConfig``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuflow.operators.airflow_names import AirflowFailException
from gpuflow.runs.trigger_form import dag_form

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator

    from gpuflow.configuration.model import GpuflowConfig


def config_from_params(context: Any) -> GpuflowConfig:
    """The run's configuration: its config file, then the fields its conf sets. A bad one fails the task without
    retries.

    What the run's conf sends is untrusted (``gpuflow.runs.run_policy``): it may hold the form's declared fields
    only, each one a run may choose, checked against the file's own values, each set as a value. The file is the
    DAG's own (its site's, fixed at parse; configs/local.yaml for a DAG of the user's own without a form), never
    the conf's."""
    from gpuflow.configuration.loading import load_config
    from gpuflow.configuration.model import ConfigError
    from gpuflow.runs.run_policy import check_run_conf, run_request

    conf = dict(getattr(context.get("dag_run"), "conf", None) or {})
    dag = context["dag"]
    layout = dag_form(dag)
    try:
        request = run_request(layout, list(dag.params.keys()), dict(context["params"]), conf)
        config_file = layout.config_file if layout is not None else None
        check_run_conf(request.values, load_config(config_file, request.defaults))
        return load_config(config_file, request.defaults, run_values=request.values)
    except ConfigError as error:
        raise AirflowFailException(str(error)) from None


class DerivesRunConfig:
    """The run's configuration, as a preflight operator derives it: the configuration file it names
    (``config_file``, with ``settings`` over it; rendered again, since a later task calls this on the DAG's own,
    unrendered copy of the preflight) or else the DAG's trigger form and the run's conf (``config_from_params``),
    then what the run's own context fills in for its ``workflow``."""

    workflow = "inference"  # which of preflight's rule sets apply
    config_file: Any = None
    settings: Any = None

    def derive_config(self, context: Any) -> GpuflowConfig:
        config = config_from_params(context) if self.config_file is None else self._file_config(context)
        if self.workflow == "batch":
            return batch_run_config(config, context)
        if self.workflow == "dataproc" and config.dataproc is None:
            raise AirflowFailException("the configuration has no dataproc section. Fix: use "
                                       "configs/dataproc.example.yaml or add a dataproc: section.")
        return config

    def _file_config(self, context: Any) -> GpuflowConfig:
        from gpuflow.configuration.loading import load_config
        from gpuflow.configuration.model import ConfigError

        render = self.render_template  # type: ignore[attr-defined]  # (BaseOperator's, beside this mixin)
        try:
            return load_config(render(self.config_file, context), render(self.settings, context))
        except ConfigError as error:
            raise AirflowFailException(str(error)) from None


def batch_run_config(config: GpuflowConfig, context: Any) -> GpuflowConfig:
    """A batch run's: its interval's dates filled into batch.input, batch.output and batch.dead_letter_output; its
    own deployment (deployment.mode, the streaming DAG's, does not apply to it)."""
    from gpuflow.configuration.model import ConfigError
    from gpuflow.runs.batch_templates import date_fields, fill_batch_paths

    config = config.model_copy(update={"deployment": config.deployment.model_copy(update={"mode": "ephemeral"})})
    try:
        return fill_batch_paths(config, date_fields(context))
    except ConfigError as error:
        raise AirflowFailException(str(error)) from None


def _differing_keys(left: Any, right: Any, prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two configurations' JSON (keys only: values stay out of logs)."""
    if isinstance(left, dict) and isinstance(right, dict):
        keys = sorted(set(left) | set(right))
        return [found for key in keys
                for found in _differing_keys(left.get(key), right.get(key), f"{prefix}{key}.")]
    return [] if left == right else [prefix.rstrip(".") or "(the whole configuration)"]


def trusted_config(task: BaseOperator, config_json: Any, context: Any) -> GpuflowConfig:
    """The configuration this task acts on: preflight's XCom (``config_json``), checked against what preflight
    derives again, now, from the configuration file and the run's conf (its ``derive_config``). They differ when
    the XCom was edited after preflight (the REST API and the UI let whoever may trigger a run edit XComs and clear
    tasks) or the file changed since: the task then refuses, having done nothing.

    A task whose DAG has no gpuflow preflight upstream (a DAG of the user's own that hands it a configuration
    some other way) acts on what it is given: that DAG's author chose it."""
    from pydantic import ValidationError

    from gpuflow.configuration.loading import config_from_json

    preflights = [upstream for upstream in task.get_flat_relatives(upstream=True)
                  if isinstance(upstream, DerivesRunConfig)]
    if len(preflights) != 1:
        return config_from_json(config_json)
    derived = preflights[0].derive_config(context)
    ours = derived.model_dump(mode="json")
    try:
        theirs = config_from_json(config_json).model_dump(mode="json")
    except ValidationError:  # not even a configuration (an XCom rewritten as text, say): nothing matches
        theirs = {}
    if theirs != ours:
        differing = _differing_keys(theirs, ours) if theirs else ["(not a configuration at all)"]
        raise AirflowFailException(
            f"the configuration this task was handed (the XCom of {preflights[0].task_id}) is not what "
            f"{preflights[0].task_id} derives from the configuration file and this run's conf: "
            f"{', '.join(differing[:12])}{' …' if len(differing) > 12 else ''} differ. This task did nothing. Fix: "
            "trigger a new run. (An XCom edited after preflight is refused; so is a run whose configuration "
            "file changed since its preflight.)")
    return derived
