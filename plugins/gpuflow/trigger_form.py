"""The DAGs' trigger form: the few fields people change per run first, the rest in folded sections. Each DAG
file declares its own (a ``FormLayout``); this module knows no DAG.

A person opening "Trigger" sees the values the run will use: every field is filled from the DAG's
configuration file (or, for a key the file does not set, the model's default). The per-run fields are
Params of their own; each folded section is one multi-line field of ``config.key=value`` lines, written as
``gpuflow preflight --set`` takes them, with the file's values filled in.

Why sections of lines rather than one Param per key: a form of ~75 fields is one flat list a person
cannot read, and parsing costs grow with the Params (README, "Benchmarks", has the measurements). The DAG
files attach the form after their tasks (``attach_trigger_form``), so Airflow does not copy it into each task.

What a run changes is what differs from the form's defaults (``run_settings``): a field left as shown keeps
the configuration file's value, also when the run names another configuration file. A conf that sets any
config key as a Param of its own (``model__max_new_tokens``, ``smoke_test__num_prompts``) still works.

Parsing a DAG file builds this form, so it reads YAML and the generated ``params_schema.json`` only:
no pydantic model, no provider, nothing heavy.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from airflow.sdk import Param

from gpuflow.paths import default_config_file, resolve_config_path

#: The Params' JSON schemas and defaults, generated from the pydantic model (`make generate`;
#: a test keeps it current). Read from a file so that parsing a DAG never builds the pydantic schema.
PARAMS_SCHEMA_FILE = Path(__file__).with_name("params_schema.json")

#: Airflow's unfolded section: Params without a section of their own land there.
RUN_SECTION = "Run Parameters"
SETTINGS_SECTION = "Configuration file and connection"

#: Short labels of the per-run fields; the description names the config key.
LABELS = {
    "profile": "Profile",
    "project": "Google Cloud project",
    "region": "Region",
    "bucket": "Bucket",
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
    "gcp_conn_id": "Google Cloud connection",
}


class Section:
    """A folded section of the form: one multi-line Param holding the lines of these config keys.

    Plain classes, not NamedTuples or dataclasses: those generate code when the module is imported, at every
    parse of a DAG file."""

    __slots__ = ("title", "param", "prefixes")

    def __init__(self, title: str, param: str, prefixes: tuple[str, ...]):
        self.title, self.param, self.prefixes = title, param, prefixes

    def owns(self, dotted: str) -> bool:
        return any(dotted == prefix or (prefix.endswith(".") and dotted.startswith(prefix)) for prefix in self.prefixes)


SECTIONS = {
    section.title: section
    for section in (
        Section("Model", "model_settings", ("model.",)),
        Section("GPU", "gpu_settings", ("gpu.", "require_gpu")),
        Section("Dataflow workers", "workers_settings", ("worker.", "dataflow.", "launch.", "dataflow_service_options")),
        Section("Container", "container_settings", ("container.", "beam_version", "python_version")),
        Section("Export", "export_settings", ("export.",)),
        Section("Inference batching", "inference_settings", ("inference.",)),
        Section("Smoke test", "smoke_test_settings", ("smoke_test.",)),
        Section("Pub/Sub", "pubsub_settings", ("pubsub.",)),
        Section("Local profile", "local_settings", ("local.",)),
        Section("Dataproc batch", "dataproc_settings", ("dataproc.",)),
        Section("Deployment", "deployment_settings", ("deployment.",)),
        # batch.schedule and batch.catchup are the DAG's own, read when it is parsed: no run can change them.
        Section("Batch", "batch_settings", ("batch.input", "batch.output", "batch.dead_letter_output",
                                            "batch.missing_input", "batch.input_wait_s",
                                            "batch.input_poll_interval_s", "batch.job_timeout_s")),
    )
}


class FormLayout:
    """A DAG's form, declared in its DAG file: its configuration file, the fields set per run, its sections."""

    __slots__ = ("config_file", "run_fields", "sections")

    def __init__(self, config_file: str, run_fields: tuple[str, ...], sections: tuple[str, ...]):
        # A deployment's own file (paths.SITE_CONFIG, written by deploy-composer --config) wins over the local default.
        self.config_file = default_config_file(config_file)
        self.run_fields, self.sections = run_fields, sections


#: The attribute of a DAG that holds its FormLayout (``attach_trigger_form``): its tasks read the form there.
FORM_ATTRIBUTE = "gpuflow_form"


def dag_form(dag: Any) -> FormLayout | None:
    """The form a DAG file attached to its DAG; None for a DAG of the user's own."""
    return getattr(dag, FORM_ATTRIBUTE, None)


_SETTINGS_HELP = (
    "One config key=value per line, as `gpuflow preflight --set` takes it (the value is YAML; nothing after = "
    "means none). Shown: the configuration file's values, or the default where the file sets none. "
    "docs/configuration.md describes every key."
)


@cache
def _field_schemas() -> dict[str, dict[str, Any]]:
    """Field schemas keyed by dotted config key."""
    return {schema["key"]: schema for schema in json.loads(PARAMS_SCHEMA_FILE.read_text()).values()}


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


@cache
def _read_values(path: Path, modified_ns: int) -> tuple[tuple[str, Any], ...]:
    raw = _read_yaml(path.read_text()) or {}
    values = {}
    for dotted, schema in _field_schemas().items():
        node: Any = raw
        for part in dotted.split("."):
            node = node.get(part, _MISSING) if isinstance(node, dict) else _MISSING
        values[dotted] = schema["default"] if node is _MISSING else node
    return tuple(values.items())


#: Strings YAML reads back as themselves: a letter first, then no character YAML gives a meaning to here.
#: (Words YAML reads as booleans or null are not among them.) Others are checked by reading them back.
_PLAIN_STRING = re.compile(r"[A-Za-z][A-Za-z0-9_./@-]*")
_YAML_WORDS = {"true", "false", "yes", "no", "on", "off", "null", "y", "n"}


def format_value(value: Any) -> str:
    """A value as the right-hand side of a ``key=value`` line, read back as YAML to the same value."""
    if value is None:
        return ""
    if isinstance(value, str):
        if _PLAIN_STRING.fullmatch(value) and value.lower() not in _YAML_WORDS:
            return value
        try:
            plain_reads_back = bool(value) and value.strip() == value and _read_yaml(value) == value
        except yaml.YAMLError:
            plain_reads_back = False
        return value if plain_reads_back else json.dumps(value)
    return json.dumps(value)


def _line(dotted: str, value: Any) -> str:
    return f"{dotted}={format_value(value)}"


def _normalised(line: str) -> str:
    key, _, value = line.partition("=")
    return f"{key.strip()}={value.strip()}"


def settings_lines(text: str | None) -> list[str]:
    """The ``key=value`` lines of a section field, without blanks and comments."""
    stripped = (line.strip() for line in (text or "").splitlines())
    return [_normalised(line) for line in stripped if line and not line.startswith("#")]


def form_values(layout: FormLayout) -> dict[str, Any]:
    """Every config key's value as the form shows it: its configuration file's, or the default."""
    return _file_values(layout.config_file)


def _lines_pattern(keys: list[str]) -> str:
    """A regular expression (Python and ECMAScript alike) that a section field's text must match: each line
    empty, a comment, or one of the section's keys followed by '='. A conf that breaks it is refused with 400."""
    alternatives = "|".join(re.escape(key) for key in keys)
    return rf"^(?:[ \t]*(?:(?:{alternatives})[ \t]*=[^\n]*|#[^\n]*)?[ \t]*(?:\r?\n|$))*$"


def _field_param(dotted: str, value: Any, section: str | None = None) -> Param:
    schema = _field_schemas()[dotted]
    extra = {name: schema[name] for name in ("enum", "minimum", "maximum", "exclusiveMinimum") if name in schema}
    if section:
        extra["section"] = section
    return Param(value, type=schema["type"], title=LABELS.get(dotted, dotted),
                 description=f"{dotted}: {schema['description']}", **extra)


def dag_params(layout: FormLayout) -> dict[str, Param]:
    """The trigger form of one DAG: per-run fields, then one folded field per section, then the config file."""
    values = form_values(layout)
    params = {dotted.replace(".", "__"): _field_param(dotted, values[dotted]) for dotted in layout.run_fields}
    for title in layout.sections:
        section = SECTIONS[title]
        keys = [key for key in _field_schemas() if section.owns(key) and key not in layout.run_fields]
        params[section.param] = Param(
            "\n".join(_line(key, values[key]) for key in keys), type="string", format="multiline",
            title=f"{title} settings", description=_SETTINGS_HELP, section=title, pattern=_lines_pattern(keys),
        )
    params["config_file"] = Param(
        layout.config_file, type="string", title="Configuration file", section=SETTINGS_SECTION,
        description="YAML configuration, relative to the project root or absolute. Fields left as shown take this "
                    "file's values; a field you change overrides it.",
    )
    params["gcp_conn_id"] = _field_param("gcp_conn_id", values["gcp_conn_id"], section=SETTINGS_SECTION)
    return params


def attach_trigger_form(dag: Any, layout: FormLayout) -> None:
    """Give a DAG its trigger form once its tasks exist (and keep the layout on the DAG, where its tasks and
    ``gpuflow.task_timeouts`` read it).

    Airflow deep-copies a DAG's Params into each task it creates (``get_merged_defaults``), which made
    llm_streaming_inference parse at ~1.7x a one-task DAG even with 20 Params. Set afterwards, the Params
    live on the DAG alone: the form, the trigger's validation (a 400 for a bad conf) and the tasks' context are
    the same, since Airflow builds a task's params from the DAG's, the task's (now none) and the run's conf
    (``process_params``). A scheduled DAG's Params are validated on assignment, as in the constructor.
    """
    dag.params = dag_params(layout)
    setattr(dag, FORM_ATTRIBUTE, layout)


def run_settings(layout: FormLayout | None, params: Mapping[str, Any]) -> tuple[str | None, dict[str, Any], list[str]]:
    """What a run asks for: (config file, Params it changed, ``key=value`` lines it changed).

    Only what differs from the form's defaults counts, so an untouched field keeps the file's value. A Param
    that is no field of the form (a conf key such as ``smoke_test__num_prompts``) counts unless it is empty.
    """
    # layout None: a DAG of the user's own, whose Params all count unless empty
    form = dag_params(layout) if layout else {}
    config_file = params.get("config_file") or (layout.config_file if layout else None)
    changed: dict[str, Any] = {}
    lines: list[str] = []
    sections = {SECTIONS[title].param for title in layout.sections} if layout else set()
    for key, value in params.items():
        if key == "config_file":
            continue
        if key in sections:
            shown = set(settings_lines(form[key].value))
            lines += [line for line in settings_lines(value) if line not in shown]
        elif key in form:
            if value != form[key].value:
                # None clears a field; as a line it reaches the model as None instead of being skipped.
                if value is None:
                    lines.append(f"{key.replace('__', '.')}=")
                else:
                    changed[key] = value
        elif value not in (None, ""):
            changed[key] = value
    return config_file, changed, lines
