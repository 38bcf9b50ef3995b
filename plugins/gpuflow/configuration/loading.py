"""Loading the configuration: the YAML file, then the DAG run's Params, then ``--set`` overrides, validated once
into a ``GpuflowConfig`` (``gpuflow.configuration.model`` holds the model); and the project files a run reads beside it.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gpuflow.configuration.model import ConfigError, GpuflowConfig
from gpuflow.paths import PROJECT_ROOT, project_path, resolve_config_path

# --------------------------------------------------------------------------------------------
# Loading


def _set_dotted(target: dict[str, Any], dotted_key: str, value: Any) -> None:
    keys = dotted_key.split(".")
    node = target
    for key in keys[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = {}
            node[key] = child
        node = child
    node[keys[-1]] = value


def parse_override(assignment: str) -> tuple[str, Any]:
    """``"gpu.count=2"`` -> ``("gpu.count", 2)``; the value is read as YAML."""
    key, sep, raw_value = assignment.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {assignment!r}: write it as dotted.key=value, for example --set gpu.count=2")
    if not raw_value.strip():
        return key.strip(), None
    value = yaml.safe_load(raw_value)
    # Keep "3.10" a string: YAML would read it as the float 3.1. Pydantic still turns "1.5" into a float.
    return key.strip(), raw_value.strip() if isinstance(value, float) else value


def _format_validation_error(error: ValidationError, source: str, names: dict[str, str] | None = None) -> str:
    """One line per invalid field, with its fix. ``names`` (dotted key -> what set it, an operator's argument):
    each line names what the reader set."""
    lines = [f"Invalid gpuflow configuration ({source}):"]
    for item in error.errors():
        key = ".".join(str(part) for part in item["loc"]) or "(root)"
        field = f"{names[key]} ({key})" if names and key in names else key
        named = names[key] if names and key in names else key
        if item["type"] == "extra_forbidden":
            lines.append(f"  {field}: unknown key. Fix: remove it or check its spelling against docs/configuration.md.")
        elif key == "project" and isinstance(item.get("input"), int):
            lines.append(f"  {field}: {item['input']} is a project number; gpuflow needs the project id. Fix: set "
                         f"{named} to the id that `gcloud projects describe {item['input']} "
                         "--format='value(projectId)'` prints.")
        elif item["type"] == "string_type" and item.get("input") in (None, ""):
            lines.append(f"  {field}: must not be empty. Fix: set {named} to a value, or leave the key out for "
                         "its default.")
        else:
            lines.append(f"  {field}: {item['msg']}. Fix: set {named} to a valid value.")
    return "\n".join(lines)


def load_config(
    config_file: str | Path | None = None,
    params: dict[str, Any] | None = None,
    overrides: list[str] | None = None,
    run_values: dict[str, Any] | None = None,
) -> GpuflowConfig:
    """Build and validate the configuration: the file, then non-empty ``params`` (a DAG author's settings), then a
    run's ``run_values`` (dotted leaf key -> value, each set as a value, None included: ``gpuflow.runs.run_policy``
    has checked them), then ``--set`` overrides (the operator's own text).

    ``source_file`` is the file's path, whatever the file or anything else says: a lasting deployment belongs to it."""
    path = resolve_config_path(config_file)
    raw = read_config_file(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"config file {path} must hold a mapping of keys, not {type(raw).__name__}.")
    if "source_file" in raw:
        raise ConfigError(f"config file {path} sets source_file, which gpuflow sets itself (the file a configuration "
                          "was read from). Fix: remove the key.")
    merged = copy.deepcopy(raw)
    for key, value in (params or {}).items():
        if key == "config_file" or value is None or value == "":
            continue
        _set_dotted(merged, param_key_to_dotted(key), value)
    for dotted, value in (run_values or {}).items():
        _set_dotted(merged, dotted, value)
    for assignment in overrides or []:
        key, value = parse_override(assignment)
        _set_dotted(merged, key, value)
    merged["source_file"] = str(path.resolve())
    try:
        return GpuflowConfig.model_validate(merged)
    except ValidationError as error:
        raise ConfigError(_format_validation_error(error, str(path))) from None


def config_from_settings(settings: dict[str, Any], what: str, names: dict[str, str] | None = None) -> GpuflowConfig:
    """gpuflow's defaults with ``settings`` (dotted key -> value, None left out) set, and no file: an operator given
    plain arguments in a team's own DAG. An error names ``what`` (the operator and its task) and, for each key,
    the argument that set it (``names``: dotted key -> argument)."""
    merged: dict[str, Any] = {}
    for key, value in settings.items():
        if value is not None and value != "":
            _set_dotted(merged, key, value)
    try:
        return GpuflowConfig.model_validate(merged)
    except ValidationError as error:
        raise ConfigError(_format_validation_error(error, what, names)) from None


def read_config_file(path: Path) -> Any:
    """The file's YAML (or JSON). Every error names the file and, for a syntax error, the line and column, and never
    shows the file's text: a message can reach a task log that people who may not read the file can read."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist. Fix: pass --config with an existing file.") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not UTF-8 text. Fix: save it as UTF-8 YAML.") from None
    except OSError as error:
        raise ConfigError(f"config file {path} cannot be read ({error.strerror or type(error).__name__}). Fix: "
                          "pass --config with a readable YAML file.") from None
    try:
        return yaml.safe_load(text) or {}
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"config file {path} is not valid YAML{where}. Fix: correct the file there (a YAML "
                          "linter, or `python -c 'import yaml,sys; yaml.safe_load(open(sys.argv[1]))' FILE`, "
                          "names the problem).") from None


def config_from_json(data: dict[str, Any] | str) -> GpuflowConfig:
    """Rebuild the configuration a previous task validated and pushed to XCom."""
    if isinstance(data, str):
        return GpuflowConfig.model_validate_json(data)
    return GpuflowConfig.model_validate(data)


# --------------------------------------------------------------------------------------------
# Airflow Params: one per leaf field, all optional, so the trigger form shows every field.

PARAM_SEPARATOR = "__"


def param_key_to_dotted(key: str) -> str:
    return key.replace(PARAM_SEPARATOR, ".")


# --------------------------------------------------------------------------------------------
# Project files


def beam_jobs_dir() -> Path:
    """beam_jobs/ beside plugins/ in a checkout, or under data/ on Cloud Composer."""
    directory = project_path("beam_jobs")
    if not (directory / "llm_inference.py").exists():
        raise ConfigError(
            f"beam_jobs/ not found in {PROJECT_ROOT} or {PROJECT_ROOT / 'data'}. Fix: deploy beam_jobs/ beside "
            "plugins/ (on Cloud Composer: into the bucket's data/ folder, `make deploy-composer`)."
        )
    return directory
