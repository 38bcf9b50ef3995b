"""Where a batch run reads and writes: the configuration's path templates, filled once per run by preflight, and
the staging folders its job writes into before the DAG publishes them."""

from __future__ import annotations

import string
from typing import Any

from gpuflow.configuration.model import ConfigError, GpuflowConfig

#: The run's Airflow date fields a batch path may name, each filled with its value as text.
DATE_FIELDS = ("ds", "ds_nodash", "ts_nodash", "data_interval_start", "data_interval_end")
#: Every field a batch path may name: the configuration's bucket, and the dates.
TEMPLATE_FIELDS = ("bucket", *DATE_FIELDS)
PATH_KEYS = ("input", "output", "dead_letter_output")
#: The answers folder's marker, written last: its presence says the folder holds one whole run's answers.
SUCCESS_FILE = "_SUCCESS"
#: What the names of the files gpuflow publishes into an answers or dead-letters folder start with (responses.jsonl,
#: dead_letters.jsonl, _SUCCESS, summary.json): a rerun replaces these, and only these.
OUTPUT_STEMS = ("responses", "dead_letters", SUCCESS_FILE, "summary")
#: gpuflow's own prefix in a bucket (run folders, deployments' records and model versions, leases): no batch output
#: may lie under it, since publishing replaces files there.
GPUFLOW_PREFIX = "gpuflow/"


def under_prefix(path: str, prefix: str) -> bool:
    """``path`` lies in the folder ``prefix`` names, compared at a segment boundary: ``gs://b/answers`` is in
    ``gs://b/answers/`` and ``gs://b/answers``; ``gs://b/answers-evil/`` in neither."""
    folder = prefix if prefix.endswith("/") else prefix + "/"
    return path.startswith(folder) or path == folder.rstrip("/")


def is_gpuflow_output(file_name: str) -> bool:
    return file_name.startswith(OUTPUT_STEMS)


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


def is_gcs(path: str) -> bool:
    return path.startswith("gs://")


def split_gcs_uri(uri: str) -> tuple[str, str]:
    """``gs://bucket/a/b`` -> ``("bucket", "a/b")``."""
    bucket, _, name = uri.removeprefix("gs://").partition("/")
    return bucket, name


def staging_folder(final_folder: str, run_prefix: str) -> str:
    """The folder a run's job writes into before publishing to ``final_folder``: beside it, in the same bucket or
    file system (so that publishing is a copy within it), under a name that readers skip (``_`` first)."""
    parent, _, leaf = final_folder.rstrip("/").rpartition("/")
    return f"{parent}/_gpuflow-staging-{run_prefix}-{leaf}/"


def staging_folders(config: GpuflowConfig, run_prefix: str) -> tuple[str, str]:
    """(answers, dead letters) staging folders of a run."""
    return (staging_folder(config.batch.output, run_prefix),
            staging_folder(config.batch.dead_letter_output, run_prefix))
