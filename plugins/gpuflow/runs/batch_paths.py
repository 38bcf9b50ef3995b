"""Where a batch run's job writes before the DAG publishes its outputs (staging folders beside the final ones), and
which files in an outputs folder are gpuflow's. The paths themselves: ``gpuflow.runs.batch_templates``."""

from __future__ import annotations

from gpuflow.configuration.model import GpuflowConfig

#: The answers folder's marker, written last: its presence says the folder holds one whole run's answers.
SUCCESS_FILE = "_SUCCESS"
#: What the names of the files gpuflow publishes into an answers or dead-letters folder start with (responses.jsonl,
#: dead_letters.jsonl, _SUCCESS, summary.json): a rerun replaces these, and only these.
OUTPUT_STEMS = ("responses", "dead_letters", SUCCESS_FILE, "summary")


def is_gpuflow_output(file_name: str) -> bool:
    return file_name.startswith(OUTPUT_STEMS)


def staging_folder(final_folder: str, run_prefix: str) -> str:
    """The folder a run's job writes into before publishing to ``final_folder``: beside it, in the same bucket or
    file system (so that publishing is a copy within it), under a name that readers skip (``_`` first)."""
    parent, _, leaf = final_folder.rstrip("/").rpartition("/")
    return f"{parent}/_gpuflow-staging-{run_prefix}-{leaf}/"


def staging_folders(config: GpuflowConfig, run_prefix: str) -> tuple[str, str]:
    """(answers, dead letters) staging folders of a run."""
    return (staging_folder(config.batch.output, run_prefix),
            staging_folder(config.batch.dead_letter_output, run_prefix))
