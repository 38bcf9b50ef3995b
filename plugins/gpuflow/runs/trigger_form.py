"""The DAGs' trigger form: the few fields people change per run first, then folded sections of typed fields.
Each DAG declares its own (a ``FormLayout``, in ``gpuflow.site_dags``); this module knows no DAG.

A person opening "Trigger" sees the values the run will use: every field is filled from the DAG's configuration
file (or, for a key the file does not set, the model's default). Every field is a Param of its own, with the key's
type, its choices and its bounds, so that the form (and the REST API, with a 400) refuses a bad value before a
run starts; the cost knobs' fields carry the site's limits (``site_bounds``). Keys nobody sets per run (topic
names, poll intervals, list- and map-valued settings) are not in the form: they stay in the configuration file, the
site's, which the form shows and no run can change.

What a run sends wins (``gpuflow.runs.run_policy.run_request``), even a value equal to the file's; a key it does not
send comes from the configuration file. The form sends every field it shows, so a run triggered from it uses those
values, and the file gives the rest; a REST conf that names single keys (``{"model__max_new_tokens": 8}``) changes
only those.

The DAG files attach the form after their tasks (``attach_trigger_form``), so Airflow does not copy it into each
task. Parsing a DAG file builds this form, so it reads YAML and the generated ``configuration/params_schema.json``
only: no pydantic model, no provider, nothing heavy.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from airflow.sdk import Param

from gpuflow.paths import resolve_config_path

#: The Params' JSON schemas and defaults, generated from the pydantic model (`make generate`;
#: a test keeps it current). Read from a file so that parsing a DAG never builds the pydantic schema.
PARAMS_SCHEMA_FILE = Path(__file__).parents[1] / "configuration" / "params_schema.json"

#: Airflow's unfolded section: Params without a section of their own land there.
RUN_SECTION = "Run Parameters"
SETTINGS_SECTION = "Configuration file"
#: The form's field that shows the site's configuration file: a choice of that one file (Airflow's form hides a const
#: field, and shows a choice), so a conf that names another file is refused at trigger (a 400), and one that names
#: the same changes nothing.
CONFIG_FILE_PARAM = "config_file"

#: Each field's short label; its description names the config key.
LABELS = {
    "region": "Region",
    "model.name": "Model",
    "model.max_new_tokens": "Max new tokens",
    "gpu.type": "GPU type",
    "gpu.count": "GPUs per worker",
    "gpu.machine_type": "Machine type",
    "worker.max_num_workers": "Max workers",
    "dataproc.accelerator": "GPU type",
    "dataproc.executor_instances": "Executors",
    "batch.input": "Input (JSONL glob)",
    "batch.output": "Answers folder",
    "deployment.mode": "Deployment mode",
    "deployment.name": "Deployment name",
    "janitor.dry_run": "Dry run (list, delete nothing)",
    "model.architecture": "Architecture",
    "model.dtype": "Inference dtype",
    "model.chat_template": "Chat template",
    "model.max_input_tokens": "Max input tokens",
    "model.parameters_m": "Parameters (millions)",
    "require_gpu": "Require a GPU",
    "gpu.request": "How the GPU is asked for",
    "gpu.sharing": "GPU sharing",
    "gpu.model_copies": "Model copies",
    "gpu.zone": "Zone (pin)",
    "worker.machine_type": "CPU worker machine type",
    "worker.disk_size_gb": "Worker disk (GB)",
    "dataflow.stop_action": "Stop action",
    "launch.mode": "Launch mode",
    "container.recipe": "Recipe",
    "container.image": "Image (prebuilt)",
    "export.model_dir": "Model folder (kept)",
    "export.machine_type": "Export machine type",
    "inference.engine": "Engine",
    "inference.max_batch_size": "Max batch size",
    "inference.max_batch_duration_secs": "Max batch wait (s)",
    "inference.group_by_length": "Group by length",
    "smoke_test.num_prompts": "Prompts",
    "smoke_test.timeout_s": "Answer timeout (s)",
    "smoke_test.gpu_usage": "GPU usage check",
    "dataproc.runtime_version": "Runtime version",
    "dataproc.executor_cores": "Executor cores",
    "dataproc.executor_memory": "Executor memory (MB)",
    "dataproc.disk_size": "Disk (GB)",
    "dataproc.xgboost": "XGBoost",
    "deployment.rollout_timeout_s": "Rollout timeout (s)",
    "batch.dead_letter_output": "Dead-letter folder",
    "batch.missing_input": "When the input is missing",
    "batch.input_wait_s": "Input wait (s)",
    "batch.job_timeout_s": "Job timeout (s)",
}


#: The knobs that raise what a run costs, each with the limits (``limits.*``, the configuration file's) that let a run
#: raise it: without them, a run may lower the knob, or keep the file's value, never raise it
#: (``gpuflow.runs.run_policy``); with them, preflight checks the run against those limits
#: (``gpuflow.preflight.limit_rules``). Each such field's description in the form says which, with the file's values.
COST_KNOBS = {
    "worker.max_num_workers": ("max_gpus",),
    "gpu.count": ("max_gpus",),
    "dataproc.executor_instances": ("max_dataproc_executors",),
    "deployment.mode": ("lasting_deployments",),
    **dict.fromkeys(("batch.job_timeout_s", "dataproc.timeout_s", "smoke_test.timeout_s",
                     "deployment.rollout_timeout_s", "batch.input_wait_s"), ("max_job_hours",)),
    **dict.fromkeys(("gpu.type", "dataproc.accelerator"), ("gpu_types",)),
    **dict.fromkeys(("gpu.machine_type", "worker.machine_type"), ("max_usd_per_hour",)),
    "region": ("regions",),  # where the GPUs, their quota and their prices are
}


def _cost_note(dotted: str, values: dict[str, Any]) -> str:
    """What the form says of a cost knob's bound: the configuration file's limits, or that there is none."""
    limits = COST_KNOBS.get(dotted)
    if not limits:
        return ""
    set_ = {name: values.get(f"limits.{name}") for name in limits}
    if all(value not in (None, []) for value in set_.values()):
        shown = ", ".join(f"limits.{name} = {value}" for name, value in set_.items())
        return f" Bounded by the configuration file's {shown}."
    return (f" The configuration file sets no {' or '.join('limits.' + name for name in limits)}: a run may not raise "
            f"it above the file's value ({values.get(dotted)}).")


class Section:
    """A folded section of the form: the config keys a person sets per run, each its own typed field.

    Plain classes, not NamedTuples or dataclasses: those generate code when the module is imported, at every
    parse of a DAG file."""

    __slots__ = ("title", "keys")

    def __init__(self, title: str, keys: tuple[str, ...]):
        self.title, self.keys = title, keys


SECTIONS = {
    section.title: section
    for section in (
        Section("Model", ("model.architecture", "model.dtype", "model.chat_template", "model.max_input_tokens",
                          "model.parameters_m")),
        Section("GPU", ("require_gpu", "gpu.request", "gpu.sharing", "gpu.model_copies", "gpu.zone")),
        # The project's network and service account are set once, in the file, not per run.
        Section("Dataflow workers", ("worker.machine_type", "worker.disk_size_gb", "worker.max_num_workers",
                                     "dataflow.stop_action", "launch.mode")),
        Section("Container", ("container.recipe", "container.image")),
        Section("Export", ("export.model_dir", "export.machine_type")),
        Section("Inference batching", ("inference.engine", "inference.max_batch_size",
                                       "inference.max_batch_duration_secs", "inference.group_by_length")),
        Section("Smoke test", ("smoke_test.num_prompts", "smoke_test.timeout_s", "smoke_test.gpu_usage")),
        Section("Dataproc batch", ("dataproc.runtime_version", "dataproc.executor_cores", "dataproc.executor_memory",
                                   "dataproc.disk_size", "dataproc.xgboost")),
        Section("Deployment", ("deployment.rollout_timeout_s",)),
        # batch.schedule and batch.catchup are the DAG's own, read when it is parsed: no run can change them.
        Section("Batch", ("batch.dead_letter_output", "batch.missing_input", "batch.input_wait_s",
                          "batch.job_timeout_s")),
    )
}


class FormLayout:
    """A DAG's form, declared where the DAG is made (``gpuflow.site_dags``): its configuration file (the site's,
    fixed at parse), the fields set per run, its sections."""

    __slots__ = ("config_file", "run_fields", "sections", "file_only")

    def __init__(self, config_file: str, run_fields: tuple[str, ...], sections: tuple[str, ...],
                 file_only: tuple[str, ...] = ()):
        self.config_file = config_file
        self.run_fields, self.sections = run_fields, sections
        # Keys the form shows, read-only, in the configuration file's description: no run may set them.
        self.file_only = file_only


#: The attribute of a DAG that holds its FormLayout (``attach_trigger_form``): its tasks read the form there.
FORM_ATTRIBUTE = "gpuflow_form"


def dag_form(dag: Any) -> FormLayout | None:
    """The form a DAG file attached to its DAG; None for a DAG of the user's own."""
    return getattr(dag, FORM_ATTRIBUTE, None)


@cache
def _field_schemas() -> dict[str, dict[str, Any]]:
    """Field schemas keyed by dotted config key."""
    return {schema["key"]: schema for schema in json.loads(PARAMS_SCHEMA_FILE.read_text()).values()}


def field_schema(dotted: str) -> dict[str, Any] | None:
    """The generated JSON schema of one config key (its type, choices, bounds, default); None for an unknown key."""
    return _field_schemas().get(dotted)


_MISSING = object()
#: libyaml's loader where PyYAML has it: the form reads YAML at every parse of a DAG file.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _read_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_YAML_LOADER)  # a safe loader, C or Python


def _file_values(config_file: str) -> dict[str, Any]:
    """The value of every known config key in the file, or its default where the file has none.

    Read once per version of the file (its modification time): the form and the tasks' execution timeouts
    both read it while a DAG file is parsed."""
    path = resolve_config_path(config_file)
    return dict(_read_values(path, path.stat().st_mtime_ns))


def file_has_section(config_file: str, section: str) -> bool:
    """Whether the configuration file sets the section (``dataproc``: the site has a Dataproc batch DAG)."""
    path = resolve_config_path(config_file)
    return isinstance(_read_raw(path, path.stat().st_mtime_ns).get(section), dict)


@cache
def _read_raw(path: Path, modified_ns: int) -> dict[str, Any]:
    raw = _read_yaml(path.read_text())
    return raw if isinstance(raw, dict) else {}


@cache
def _read_values(path: Path, modified_ns: int) -> tuple[tuple[str, Any], ...]:
    raw = _read_raw(path, modified_ns)
    values = {}
    for dotted, schema in _field_schemas().items():
        node: Any = raw
        for part in dotted.split("."):
            node = node.get(part, _MISSING) if isinstance(node, dict) else _MISSING
        values[dotted] = schema["default"] if node is _MISSING else node
    return tuple(values.items())


def form_values(layout: FormLayout) -> dict[str, Any]:
    """Every config key's value as the form shows it: its configuration file's, or the default."""
    return _file_values(layout.config_file)


#: The fields' schemas use draft-07 keywords only, and say so. jsonschema's validate() first checks a schema against
#: the meta-schema its "$schema" names (validator_for; the newest draft, 2020-12, when none is named), and Airflow
#: validates every Param of a scheduled DAG when its file is parsed: draft-07's check costs 0.18 ms a field here,
#: 2020-12's 0.62 ms, which made the batch DAG's ~45 fields most of its parse time.
SCHEMA_DIALECT = "http://json-schema.org/draft-07/schema#"


#: The characters of Unicode's categories Cc and Cf in the Basic Multilingual Plane, as a regular expression's class
#: that Python's re and the browser's both read (a test derives the set from unicodedata and compares). The
#: configuration model refuses every Cc and Cf character, those beyond the BMP included.
UNSAFE_BMP = (r"\u0000-\u001f\u007f-\u009f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u180e"
              r"\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb")
#: The paths a run may name: no '.' or '..' segment and no control or format character, said in the schema, so that
#: the form and the REST API (a 400) refuse them before a run exists; ``gpuflow.runs.run_policy`` checks the rest in
#: preflight.
PATH_PATTERN = r"^(?!(.*/)?\.\.?(/|$))[^" + UNSAFE_BMP + r"]*$"
PATH_FIELDS = ("batch.input", "batch.output", "batch.dead_letter_output", "export.model_dir")


#: The timeouts a run may raise up to limits.max_job_hours (COST_KNOBS), in seconds.
_JOB_HOURS_KNOBS = tuple(key for key, limits in COST_KNOBS.items() if limits == ("max_job_hours",))


def site_bounds(dotted: str, value: Any, values: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """The schema keywords that hold a cost knob (``COST_KNOBS``) to the site's limits, so that Airflow refuses a
    run beyond them at trigger (a 400), before anything exists: the file's value, and above it only what a limit
    the file sets allows (``gpuflow.runs.run_policy`` holds a run to the same in preflight, and preflight's limit
    rules check what a schema cannot say, such as a machine type's price). The file's own value always passes, so
    that the DAG parses even where the file breaks its own limits (preflight then says so)."""
    limit = {name: values.get(f"limits.{name}") for name in COST_KNOBS.get(dotted, ())}
    if not limit:
        return {}

    def highest(bound: Any) -> dict[str, Any]:
        if value is None:  # no number in the file: the schema's own bounds, and preflight's
            return {}
        top = max(value, bound) if bound is not None else value
        return {"maximum": min(top, schema["maximum"]) if "maximum" in schema else top}

    if dotted in ("gpu.count", "worker.max_num_workers"):
        return highest(limit["max_gpus"])
    if dotted == "dataproc.executor_instances":
        return highest(limit["max_dataproc_executors"])
    if dotted in _JOB_HOURS_KNOBS:
        hours = limit["max_job_hours"]
        return highest(hours * 3600 if hours is not None else None)
    if dotted == "deployment.mode":
        lasting = limit["lasting_deployments"] is True or value == "persistent"
        return {"enum": ["ephemeral", "persistent"] if lasting else [value]}
    if dotted in ("gpu.type", "dataproc.accelerator", "region"):
        allowed = limit["regions"] if dotted == "region" else limit["gpu_types"]
        choices = [value, *(["none"] if dotted == "gpu.type" else []), *(allowed or [])]
        return {"enum": [c for i, c in enumerate(choices) if c not in choices[:i]
                         and ("enum" not in schema or c in schema["enum"])]}
    if limit.get("max_usd_per_hour") is None:  # machine types: the file's, unless a price bound lets preflight judge
        return {"enum": [value]}
    return {}


def _field_param(dotted: str, value: Any, values: dict[str, Any], section: str | None = None) -> Param:
    schema = _field_schemas()[dotted]
    extra: dict[str, Any] = {name: schema[name] for name in ("enum", "minimum", "maximum", "exclusiveMinimum")
                             if name in schema}
    extra.update(site_bounds(dotted, value, values, schema))
    if dotted in PATH_FIELDS:
        extra["pattern"] = PATH_PATTERN
    extra["$schema"] = SCHEMA_DIALECT
    if section:
        extra["section"] = section
    return Param(value, type=schema["type"], title=LABELS.get(dotted, dotted),
                 description=f"{dotted}: {schema['description']}{_cost_note(dotted, values)}", **extra)


def _dialect() -> dict[str, Any]:
    """The schema's dialect, a keyword no Python name can spell."""
    return {"$schema": SCHEMA_DIALECT}


def dag_params(layout: FormLayout) -> dict[str, Param]:
    """The trigger form of one DAG: per-run fields, then each section's typed fields, then the config file."""
    values = form_values(layout)
    params = {dotted.replace(".", "__"): _field_param(dotted, values[dotted], values) for dotted in layout.run_fields}
    for title in layout.sections:
        for dotted in SECTIONS[title].keys:
            if dotted not in layout.run_fields:
                params[dotted.replace(".", "__")] = _field_param(dotted, values[dotted], values, section=title)
    params[CONFIG_FILE_PARAM] = Param(
        layout.config_file, type="string", enum=[layout.config_file], title="Configuration file",
        section=SETTINGS_SECTION, **_dialect(),
        description=f"The site's configuration file, which gives every key this form does not show "
                    "(docs/configuration.md lists them). It is fixed when the DAG file is parsed: a run cannot name "
                    "another (Airflow refuses the trigger); each site file has its own DAGs (docs/security.md). "
                    f"The values this form shows are {layout.config_file}'s." + _file_note(layout, values),
    )
    return params


def _file_note(layout: FormLayout, values: dict[str, Any]) -> str:
    """The keys only the configuration file sets, with that file's values: shown, not editable (not declared, so a
    run's conf naming one is refused)."""
    if not layout.file_only:
        return ""
    shown = "; ".join(f"{dotted} = {values.get(dotted)}" for dotted in layout.file_only)
    return f" Set in the file only, never by a run: {shown}."


def attach_trigger_form(dag: Any, layout: FormLayout) -> None:
    """Give a DAG its trigger form once its tasks exist (and keep the layout on the DAG, where its tasks and
    ``gpuflow.runs.task_timeouts`` read it).

    Airflow deep-copies a DAG's Params into each task it creates (``get_merged_defaults``), which made
    llm_streaming_inference parse at ~1.7x a one-task DAG even with 20 Params. Set afterwards, the Params
    live on the DAG alone: the form, the trigger's validation (a 400 for a bad conf) and the tasks' context are
    the same, since Airflow builds a task's params from the DAG's, the task's (now none) and the run's conf
    (``process_params``). A scheduled DAG's Params are validated on assignment, as in the constructor.
    """
    dag.params = dag_params(layout)
    setattr(dag, FORM_ATTRIBUTE, layout)


def declared_fields(layout: FormLayout) -> dict[str, str]:
    """The fields a DAG's form declares, as the conf names them (``gpu__count``) -> their dotted config key; the form's
    ``config_file`` is not among them. A run's conf may hold these and ``config_file``, nothing else
    (``gpuflow.runs.run_policy.run_request``)."""
    keys = [*layout.run_fields, *(key for title in layout.sections for key in SECTIONS[title].keys)]
    return {dotted.replace(".", "__"): dotted for dotted in keys}
