"""A batch run's paths in its configuration: batch.input, batch.output and batch.dead_letter_output are templates,
filled once per run with the bucket and the run's dates (preflight, and every later task as it derives the run's
configuration again)."""

from __future__ import annotations

import string
from typing import Any

from gpuflow.configuration.model import ConfigError, GpuflowConfig
from gpuflow.gcs_uris import under_prefix
from gpuflow.runs.naming import GPUFLOW_PREFIX

#: The run's Airflow date fields a batch path may name, each filled with its value as text.
DATE_FIELDS = ("ds", "ds_nodash", "ts_nodash", "data_interval_start", "data_interval_end")
#: Every field a batch path may name: the configuration's bucket, and the dates.
TEMPLATE_FIELDS = ("bucket", *DATE_FIELDS)
PATH_KEYS = ("input", "output", "dead_letter_output")


def date_fields(context: Any) -> dict[str, str]:
    """The run's date fields for the templates; a run without a logical date has none to fill {ds} with."""
    fields = {}
    for name in DATE_FIELDS:
        value = context.get(name)
        if value is not None:
            fields[name] = value.isoformat() if hasattr(value, "isoformat") else str(value)
    return fields


def fill_batch_paths(config: GpuflowConfig, fields: dict[str, str]) -> GpuflowConfig:
    """The configuration with batch.input, batch.output and batch.dead_letter_output filled for one run."""
    known = {**fields, **({"bucket": config.bucket} if config.bucket else {})}
    filled = {}
    for key in PATH_KEYS:
        template = getattr(config.batch, key)
        named = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
        unknown = sorted(named - set(TEMPLATE_FIELDS))
        if unknown:
            raise ConfigError(f"batch.{key} {template!r} names {unknown}, which no run fills. Fix: use only "
                              f"{', '.join('{' + name + '}' for name in TEMPLATE_FIELDS)}.")
        if "bucket" in named and "bucket" not in known:
            raise ConfigError(
                f"batch.{key} {template!r} uses {{bucket}} but bucket is empty (each run would create its own bucket "
                "and delete it, answers included). Fix: set bucket to a bucket you keep, or write full paths.")
        missing = sorted(named - set(known))
        if missing:
            raise ConfigError(f"batch.{key} {template!r} needs {missing}, and this run has no logical date. Fix: "
                              "trigger the run with a logical date, or set batch.* to paths without dates.")
        filled[key] = template.format_map(known)
    for key in ("output", "dead_letter_output"):
        if config.bucket and under_prefix(filled[key], f"gs://{config.bucket}/{GPUFLOW_PREFIX}"):
            raise ConfigError(f"batch.{key} {filled[key]!r} lies under gpuflow's own prefix (gs://{config.bucket}/"
                              f"{GPUFLOW_PREFIX}: run folders, deployments, leases). Fix: pick another folder.")
    return config.model_copy(update={"batch": config.batch.model_copy(update=filled)})
