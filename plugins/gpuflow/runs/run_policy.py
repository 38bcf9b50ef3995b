"""What a run may choose. A run's conf (the trigger form, the REST API, ``dag.test(run_conf=…)``) is untrusted input.

Airflow's security model trusts deployment managers and DAG authors, whose code runs on the workers, and not every
authenticated user who may trigger a DAG
(airflow.apache.org/docs/apache-airflow/stable/security/security_model.html). So a run may choose knobs (numbers,
switches, choices, and names whose format gpuflow checks), never code, identity, files outside the project or what
gets deleted. Everything else comes from the configuration file, which only those trusted people write
(docs/security.md says who sets what).

The rules run where a task reads the run's conf (``operators.run_config.config_from_params``: the preflight tasks),
so a refused run has created nothing.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuflow.configuration.model import (
    DEMO_MODELS,
    DEPLOYMENT_NAME,
    REGION,
    ZONE,
    ConfigError,
    GpuflowConfig,
    RolloutConfig,
    has_dot_segment,
    unsafe_character,
)
from gpuflow.gcs_uris import under_prefix
from gpuflow.runs.batch_templates import TEMPLATE_FIELDS
from gpuflow.runs.naming import GPUFLOW_PREFIX
from gpuflow.runs.trigger_form import COST_KNOBS

#: The field types a run may set freely: a number or a switch changes how much, never what runs or what is deleted.
KNOB_TYPES = {"integer", "number", "boolean", "null"}

#: Keys a run may not set although their type would allow it, each with the reason.
SITE_ONLY = {
    "profile": "the profile goes with its configuration file",
    "batch.schedule": "the schedule is read when the DAG is parsed",
    "batch.catchup": "catchup is read when the DAG is parsed",
    **dict.fromkeys((f"rollout.{name}" for name in RolloutConfig.model_fields),  # every one, a new one too
                    "the rollout gate is the deployment owner's: a run does not pick the bounds it is judged by"),
}

#: Why a free-text or structured key is the configuration file's alone; a key not listed is free text that no
#: check keeps a knob.
_WHY = {
    "gcp_conn_id": "it picks the credentials every task uses",
    "impersonation_chain": "it picks the identity every task acts as",
    "dataflow.service_account": "it picks the identity the jobs run as",
    "project": "it picks the project the run creates and deletes things in",
    "bucket": "it picks the bucket the run writes into and deletes from",
    "dataproc.main_python_file": "it is the code the batch runs",
    "dataproc.args": "they are the arguments of the code the batch runs",
    "dataproc.properties": "Spark properties can load code",
    "export.pip_packages": "they are code installed into the export job",
    "export.container_image": "it is the code the export runs",
    "dataflow.experiments": "experiments change what the Dataflow service runs",
    "dataflow_service_options": "service options change what the Dataflow service runs",
    "local.state_dir": "it is where local processes keep their files, and what cleanup deletes in",
    "local.pubsub_emulator_host": "it says where the run sends its data",
    "local.storage_emulator_host": "it says where the run sends its data",
    "local.runner": "it picks the code that runs the pipeline",
    **dict.fromkeys(("allowed.models", "allowed.images", "allowed.gcs_prefixes"), "it bounds what a run may pick"),
}

#: Names a run may set, each with the form it must have (Google's own rules are checked by the configuration model
#: and preflight; these keep a name a name: no path, no spaces, no shell syntax).
_NAME_FORMATS = {
    "region": REGION.pattern,
    "gpu.zone": ZONE.pattern,
    "gpu.type": r"[a-z0-9][a-z0-9-]{0,62}",
    "gpu.machine_type": r"[a-z0-9][a-z0-9-]{0,62}",
    "worker.machine_type": r"[a-z0-9][a-z0-9-]{0,62}",
    "export.machine_type": r"[a-z0-9][a-z0-9-]{0,62}",
    "dataproc.runtime_version": r"[0-9]{1,2}\.[0-9]{1,2}",
    "deployment.name": DEPLOYMENT_NAME.pattern,
    # A Docker tag: docs.docker.com/reference/cli/docker/image/tag ("a tag name ... may contain lowercase and
    # uppercase letters, digits, underscores, periods, and hyphens ... may not start with a period or a hyphen and
    # may contain a maximum of 128 characters").
    "container.flex_launcher_tag": r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}",
}


def _raises(dotted: str, value: Any, file_value: Any) -> bool:
    """Whether a run's ``value`` costs more than the file's: more of a number, a lasting deployment, another type."""
    if dotted == "deployment.mode":
        return bool(value == "persistent" and file_value != "persistent")
    if dotted == "gpu.type" and value == "none":
        return False  # CPU workers: no GPU at all
    if isinstance(value, int | float) and isinstance(file_value, int | float):
        return bool(value > file_value)
    return bool(value != file_value)


def _cost_problem(dotted: str, value: Any, base: GpuflowConfig) -> str | None:
    """Why a run may not raise the cost knob ``dotted`` (``trigger_form.COST_KNOBS``): the file sets no limit for it."""
    limits = COST_KNOBS.get(dotted)
    if limits is None:
        return None
    unset = [name for name in limits if getattr(base.limits, name) in (None, [])]
    if dotted == "deployment.mode" and base.limits.lasting_deployments is False:
        unset = ["lasting_deployments"]  # false: no run may, whatever the file's mode
    file_value = _value_of(base, dotted)
    if not unset or not _raises(dotted, value, file_value):
        return None
    named = [f"limits.{name}" for name in unset]
    beyond, keep = (("would move this run out of", "the file's value") if dotted == "region"
                    else ("would raise this run's cost above", "the file's value or below"))
    return (f"{dotted}: {_shown(value)} {beyond} the configuration file's "
            f"({_shown(file_value)}), and the file sets no limit that allows it ({', '.join(named)} is empty). Fix: "
            f"keep {dotted} at {keep}; to allow more, set {' and '.join(named)} in the configuration file "
            "(docs/security.md).")


#: Folders a run may point somewhere, within bounds (``path_problem``).
PATH_KEYS = ("batch.input", "batch.output", "batch.dead_letter_output", "export.model_dir")


def _field_types(dotted: str) -> tuple[set[str], bool] | None:
    from gpuflow.runs.trigger_form import field_schema

    schema = field_schema(dotted)
    if schema is None:
        return None
    kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    return set(kinds), "enum" in schema


def refusal(dotted: str, value: Any, base: GpuflowConfig) -> str | None:
    """Why a run may not set ``dotted`` to ``value`` over the configuration file ``base``; None when it may."""
    file_value = _value_of(base, dotted)
    if value == file_value or value is None and file_value in (None, [], {}):
        return None  # what the file says already: the form sends every field it shows
    types = _field_types(dotted)
    if types is None:
        return (f"{dotted}: no field of the configuration a run may set. Fix: leave it out of the run's conf "
                "(docs/configuration.md lists the fields).")
    kinds, choice = types
    reason = SITE_ONLY.get(dotted) or _WHY.get(dotted)
    checker = _CHECKS.get(dotted)
    if reason is None and checker is None and not (choice or kinds <= KNOB_TYPES):
        reason = "a run may set numbers, switches, choices and the names gpuflow checks, not free text"
    if reason:
        return (f"{dotted}: only the configuration file sets it ({reason}). Fix: leave it out of the run's conf; "
                "to change it, change the configuration file, or trigger the DAGs of a site whose file sets it "
                "(docs/security.md).")
    return (checker(dotted, value, base) if checker else None) or _cost_problem(dotted, value, base)


def _value_of(config: GpuflowConfig, dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        node = getattr(node, part, None)
    return node.model_dump(mode="json") if hasattr(node, "model_dump") else node


def _name(dotted: str, value: Any, base: GpuflowConfig) -> str | None:
    if isinstance(value, str) and re.fullmatch(_NAME_FORMATS[dotted], value):
        return None
    return f"{dotted}: {_shown(value)} is not a valid name for it. Fix: use a name of the form {_NAME_FORMATS[dotted]}."


def _model(dotted: str, value: Any, base: GpuflowConfig) -> str | None:
    allowed = [base.model.name, *DEMO_MODELS, *base.allowed.models]
    if value in allowed:
        return None
    return (f"model.name: {_shown(value)} is not among the models this deployment allows ({', '.join(allowed)}). "
            "Fix: pick one of them; to add one, list it under allowed.models in the configuration file.")


def _image(dotted: str, value: Any, base: GpuflowConfig) -> str | None:
    if value in (None, "") or isinstance(value, str) and any(image_under(value, p) for p in base.allowed.images):
        return None
    return (f"container.image: {_shown(value)} does not start with an image prefix this deployment allows "
            f"({', '.join(base.allowed.images) or 'none: runs build their image from the recipe'}). Fix: leave it "
            "empty, or list its prefix under allowed.images in the configuration file.")


def image_under(image: str, prefix: str) -> bool:
    """``image`` lies in the repository or folder ``prefix`` names: the prefix ends at a path segment, or the image's
    own name goes on with its tag (':') or digest ('@'). ``…/acme/gpuflow`` allows ``…/acme/gpuflow/l4:1`` and
    ``…/acme/gpuflow:1``, never ``…/acme/gpuflow-evil/x:1`` or ``…/acme/gpuflow.attacker.io/x:1``."""
    if prefix.endswith("/"):
        return image.startswith(prefix)
    return image == prefix or image.startswith(prefix) and image[len(prefix)] in "/:@"


def _recipe(dotted: str, value: Any, base: GpuflowConfig) -> str | None:
    from gpuflow.images.containers import recipe_names

    if value in (None, "", *recipe_names()):
        return None
    return f"container.recipe: {_shown(value)} is no recipe in docker/. Fix: pick one of {', '.join(recipe_names())}."


def _path(dotted: str, value: Any, base: GpuflowConfig) -> str | None:
    if value in (None, "") and dotted == "export.model_dir":
        return None
    problem = path_problem(str(value), base, dotted)
    return f"{dotted}: {problem}" if problem else None


#: Beam expands a glob with FileSystem.translate_pattern (apache_beam/io/filesystem.py): ``*`` matches within a path
#: segment, but ``**`` matches across them, ``?`` matches any character ('/' included), and ``[...]`` any character it
#: lists or does not exclude ('/' included). GCS's matchGlob reads braces as alternatives. So a run's input may hold
#: single ``*`` only, and only in its last segment, where it cannot reach into another folder.
GLOB_CHARACTERS = "*?[]{}\\"


def _glob_problem(path: str, dotted: str) -> str | None:
    """Why ``path``'s wildcards could reach beyond its own folder: gpuflow's placeholders ({bucket}, {ds}…) are no
    wildcards; single ``*`` in the last segment of batch.input is the only one allowed."""
    literal = path
    for name in TEMPLATE_FIELDS:
        literal = literal.replace("{" + name + "}", "x")
    if not any(character in GLOB_CHARACTERS for character in literal):
        return None
    if dotted != "batch.input":
        return (f"it holds a wildcard or brace ({GLOB_CHARACTERS} beyond gpuflow's placeholders "
                f"{', '.join('{' + name + '}' for name in TEMPLATE_FIELDS)}), and {dotted} is a folder. Fix: write the "
                "folder's own path.")
    folder, _, last = literal.rpartition("/")
    if any(character in GLOB_CHARACTERS for character in folder):
        return ("it holds a wildcard before its last segment, which would match folders the run may not read. Fix: "
                "write the folder in full and put the wildcard in the file name only (e.g. .../prompts/{ds}/*.jsonl).")
    if "**" in last or any(character in "?[]{}\\" for character in last):
        return ("its file name holds '**', '?', '[...]', a brace or a backslash, which can match '/' and so reach "
                "other folders (Beam's FileSystem.translate_pattern; GCS's matchGlob). Fix: use single '*' only "
                "(e.g. *.jsonl).")
    return None


def path_problem(path: str, base: GpuflowConfig, dotted: str = "batch.output") -> str | None:
    """Why a run may not read or write ``path``: a gs:// path must lie in the bucket (not in or under gpuflow's own
    prefix) or an allowed prefix, each compared at a segment boundary; a local path (local profile) under
    local.state_dir; neither with a '.' or '..' segment, an empty segment, a control or format character, or a
    wildcard that could reach beyond its folder (``_glob_problem``)."""
    shown = _shown(path)
    if has_dot_segment(path) or unsafe_character(path):
        return (f"{shown} holds a '.' or '..' segment or a control or format character. Fix: write the folder's "
                "full path in plain characters.")
    if "//" in path.removeprefix("gs://"):
        return f"{shown} holds an empty segment ('//'). Fix: write the folder's full path."
    glob = _glob_problem(path, dotted)
    if glob:
        return f"{shown}: {glob}"
    if path.startswith("gs://"):
        buckets = [f"gs://{name}/" for name in {base.bucket, "{bucket}"} if name]
        literal = path.split("*", 1)[0]
        if any(under_prefix(literal, bucket + GPUFLOW_PREFIX) for bucket in buckets):
            return (f"{shown} lies in or under gpuflow's own prefix ({GPUFLOW_PREFIX}: run folders, deployments, "
                    "leases). Fix: pick another folder of the bucket.")
        if any(under_prefix(path, prefix) for prefix in [*buckets, *base.allowed.gcs_prefixes]):
            return None
        return (f"{shown} is outside the bucket and the prefixes this deployment allows "
                f"({', '.join([*buckets, *base.allowed.gcs_prefixes]) or 'none'}). Fix: use a folder there, or list "
                "its prefix under allowed.gcs_prefixes in the configuration file.")
    state_dir = Path(base.local.state_dir).resolve()
    local_workers = not base.traits.dataflow_workers  # the local runner reads and writes this machine's disk
    if local_workers and Path(path).is_absolute() and Path(path).resolve().is_relative_to(state_dir):
        return None
    return (f"{shown} is not a gs:// path, nor (local profile) an absolute path under local.state_dir "
            f"({state_dir}). Fix: use a folder there.")


def _shown(value: Any) -> str:
    """A value as a message shows it: quoted, control characters escaped, and short."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


_CHECKS = {
    **dict.fromkeys(_NAME_FORMATS, _name),
    **dict.fromkeys(PATH_KEYS, _path),
    "model.name": _model,
    "container.image": _image,
    "container.recipe": _recipe,
}


@dataclass(frozen=True)
class RunRequest:
    """What a run's conf asks for, as values: each declared field it sets. The configuration file is never the
    conf's: a gpuflow DAG's is its site's, fixed at parse; a DAG of the user's own names its own."""

    values: dict[str, Any]  # dotted config key -> the value the run sends (None clears the file's value)
    defaults: dict[str, Any] = field(default_factory=dict)  # a DAG of the user's own: its author's non-empty Params


def run_request(layout: Any, declared_params: Collection[str], params: Mapping[str, Any],
                conf: Mapping[str, Any]) -> RunRequest:
    """The run's conf, held to its DAG's declared fields: those its form declares (a DAG of the user's own: its
    declared Params), each with the value Airflow validated against the field's schema. Any other key (a section, a
    key holding '=' or '.', a field the form does not show, a configuration file other than the DAG's) refuses the
    run, every such key named in one message. No value is ever read as text: each is set on its own field
    (``load_config(run_values=…)``).

    ``layout``: the DAG's ``trigger_form.FormLayout``, or None for a DAG of the user's own."""
    from gpuflow.runs.trigger_form import CONFIG_FILE_PARAM, declared_fields

    if layout is None:
        declared = {key: key.replace("__", ".") for key in declared_params if key != CONFIG_FILE_PARAM}
    else:
        declared = declared_fields(layout)
    # The form's own field (its one choice is the DAG's file: Airflow refused any other at trigger) changes nothing.
    same_file = layout is not None and conf.get(CONFIG_FILE_PARAM) == layout.config_file
    undeclared = [key for key in conf if key not in declared and not (key == CONFIG_FILE_PARAM and same_file)]
    if undeclared:
        raise ConfigError(
            f"this run's conf holds {len(undeclared)} key(s) its DAG does not declare: "
            f"{', '.join(_shown(key) for key in undeclared)}. A run's conf may hold the fields of the DAG's trigger "
            "form (each by its own name, e.g. gpu__count), nothing else: no configuration file either, since each "
            "site file has DAGs of its own. Fix: remove them; what the form does not show is the configuration "
            "file's to set (docs/security.md).")
    values = {}
    for key in conf:
        if key in declared:
            value = params.get(key, conf[key])
            if value != "":  # an empty text field: the file's value
                values[declared[key]] = value
    defaults = {} if layout is not None else {
        key: value for key, value in params.items()
        if key not in conf and key != CONFIG_FILE_PARAM and value not in (None, "")}
    return RunRequest(values, defaults)


def check_run_conf(sent: dict[str, Any], base: GpuflowConfig) -> None:
    """Refuse, in one message naming every key, what a run's conf (``sent``: dotted key -> value) may not choose
    over the configuration file ``base``."""
    problems = [problem for dotted, value in sent.items() if (problem := refusal(dotted, value, base))]
    if problems:
        raise ConfigError("this run's conf asks for what only the configuration file may set:\n  "
                          + "\n  ".join(problems))
