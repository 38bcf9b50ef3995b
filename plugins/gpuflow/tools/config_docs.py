"""What gpuflow generates from its configuration model, so that none of it can drift from the model: the DAGs'
Params schema (the trigger form reads the file, never pydantic, when a DAG file is parsed) and the configuration
reference, docs/configuration.md. gpuflow.tools.generated maps them to their files."""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from gpuflow.configuration.loading import PARAM_SEPARATOR
from gpuflow.configuration.model import DataprocConfig, GpuflowConfig


def _section_model(annotation: Any) -> type[BaseModel] | None:
    """The model of a section field, also when the section is optional (``DataprocConfig | None``)."""
    optional_parts = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else ()
    for candidate in (annotation, *optional_parts):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _leaf_fields(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, FieldInfo]]:
    for name, field in model.model_fields.items():
        section = _section_model(field.annotation)
        if section is not None:
            yield from _leaf_fields(section, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", field


def _defaults() -> dict[str, Any]:
    """The model's defaults (the optional Dataproc section's as if written ``dataproc: {}``)."""
    return GpuflowConfig(dataproc=DataprocConfig()).model_dump(mode="json")


def _dotted_value(values: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        values = values[part]
    return values


def params_json_schema() -> dict[str, dict[str, Any]]:
    """Each leaf field's JSON schema and default, keyed by Param name (dots written as '__').

    The trigger form (``gpuflow.runs.trigger_form``) is built from this generated file when a DAG file is parsed,
    so that parsing never builds the pydantic schema. Enums list their real choices; ``null`` is allowed only
    where the field itself is optional. The default is the model's (the Dataproc section's as ``dataproc: {}``).
    """
    full_schema = GpuflowConfig.model_json_schema()
    definitions = full_schema.get("$defs", {})
    defaults = _defaults()

    def property_schema(dotted: str) -> dict[str, Any]:
        node = full_schema
        for part in dotted.split("."):
            prop = node["properties"][part]
            ref = prop.get("$ref") or next(
                (a["$ref"] for a in prop.get("allOf", []) + prop.get("anyOf", []) if "$ref" in a), None
            )
            node = definitions[ref.split("/")[-1]] if ref else prop
        return node

    schemas: dict[str, dict[str, Any]] = {}
    for dotted, field in _leaf_fields(GpuflowConfig):
        prop = property_schema(dotted)
        default = _dotted_value(defaults, dotted)
        schema: dict[str, Any] = {"key": dotted, "description": field.description or "", "default": default}
        json_types: list[str] = []
        for option in prop.get("anyOf", [prop]):
            if "type" in option:
                json_types.append(option["type"])
            if "enum" in option:
                schema["enum"] = list(option["enum"])
            for bound in ("minimum", "maximum", "exclusiveMinimum"):
                if bound in option:
                    schema[bound] = option[bound]
        if "enum" in prop:
            schema["enum"] = list(prop["enum"])
            json_types = json_types or ["string"]
        if "enum" in schema and "null" in json_types:  # an optional choice: empty is one of the choices
            schema["enum"] = [None, *schema["enum"]]
        schema["type"] = sorted(set(json_types)) if len(set(json_types)) > 1 else json_types[0]
        schemas[dotted.replace(".", PARAM_SEPARATOR)] = schema
    return schemas


def configuration_reference() -> str:
    """docs/configuration.md, generated from the model so that it cannot drift (a test compares them)."""
    lines = [
        "# Configuration reference",
        "",
        "Generated from `gpuflow.configuration.model.GpuflowConfig` by `make generate`; do not edit by hand.",
        "",
        "One pydantic model, validated once by the run's preflight and passed to every task. A run's values come from",
        "its configuration file (`configs/local.yaml` by default; on Composer, the file `deploy-composer --config`",
        "installed), then the DAG run's Params (the trigger form's fields; dots written as `__`, e.g.",
        "`model__max_new_tokens`), then, on the command line, `--set dotted.key=value`.",
        "",
        "The `dataproc.*` keys form an optional section: present, it describes the `dataproc_gpu_batch` DAG's batch;",
        "the defaults shown are those of a section written as `dataproc: {}`.",
        "",
        "| key | type | default | description |",
        "| --- | --- | --- | --- |",
    ]
    defaults = _defaults()
    for dotted, field in _leaf_fields(GpuflowConfig):
        value = _dotted_value(defaults, dotted)
        annotation = str(field.annotation).replace("typing.", "").replace("<class '", "").replace("'>", "").replace(" | ", " or ")
        description = (field.description or "").replace("|", "\\|")
        lines.append(f"| `{dotted}` | `{annotation}` | `{json.dumps(value)}` | {description} |")
    return "\n".join(lines) + "\n"
