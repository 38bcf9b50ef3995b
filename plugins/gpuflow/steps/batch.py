"""The batch run's own steps: find the interval's input, and publish what the job staged, once its counts add up.

Idempotent per logical date: the job writes into the run's staging folders (``gpuflow.runs.batch_paths``), and
``publish_outputs`` replaces the date's folders whole, only after the job succeeded and every input line is found
answered or dead-lettered. The answers folder's ``_SUCCESS`` is removed first and written last, so a reader that
waits for it never sees a half-written or mixed folder.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from gpuflow.configuration.model import GpuflowConfig
from gpuflow.platform.files import BatchFiles
from gpuflow.runs.batch_paths import SUCCESS_FILE, staging_folders
from gpuflow.runs.naming import ResourceNames

log = logging.getLogger(__name__)

#: The files the batch job writes (beam_jobs/llm_inference.py: ANSWERS_FILE, DEAD_LETTERS_FILE, SUMMARY_FILE).
ANSWERS_FILE, DEAD_LETTERS_FILE, SUMMARY_FILE = "responses.jsonl", "dead_letters.jsonl", "summary.json"


class CountsDoNotAddUp(RuntimeError):
    """The staged outputs do not account for every input line: nothing is published."""


def find_input(config: GpuflowConfig, conn_id: str) -> list[str]:
    files = BatchFiles(**config.hook_identity(conn_id)).matching(config.batch.input)
    log.info("%d input file(s) match %s%s", len(files), config.batch.input, f": {files[:10]}" if files else "")
    return files


def _count_problems(job: dict[str, Any], lines_in: int, answered: int, dead_lettered: int) -> list[str]:
    problems = []
    if job.get("lines_in") != lines_in:
        problems.append(f"the job read {job.get('lines_in')} line(s), the input has {lines_in} now (did a file "
                        "arrive or change during the run?)")
    if job.get("answered") != answered:
        problems.append(f"the job counted {job.get('answered')} answer(s), the staged file has {answered}")
    if job.get("dead_lettered") != dead_lettered:
        problems.append(f"the job counted {job.get('dead_lettered')} dead letter(s), the staged file has "
                        f"{dead_lettered}")
    if answered + dead_lettered != lines_in:
        problems.append(f"{answered} answered + {dead_lettered} dead-lettered != {lines_in} line(s) in")
    return problems


def staged_summary(config: GpuflowConfig, names: ResourceNames, conn_id: str, job_seconds: float) -> dict[str, Any]:
    """The run's summary, from the job's own counts checked against the files: lines in (counted again in the
    input), answered and dead-lettered (counted in the staged files), which must add up; with prompts/s and
    tokens/s over the job's ``job_seconds``."""
    files = BatchFiles(**config.hook_identity(conn_id))
    staged_answers, staged_dead_letters = staging_folders(config, names.prefix)
    summary_file = staged_answers + SUMMARY_FILE
    try:
        job = json.loads(files.read_text(summary_file))
    except Exception as error:
        raise CountsDoNotAddUp(f"the batch job left no summary at {summary_file} ({error}): it did not finish. "
                               "Nothing was published. Fix: read the job's log (the run_batch task), then clear "
                               "run_batch.") from None
    inputs = files.matching(config.batch.input)
    lines_in = sum(files.count_lines(path) for path in inputs)
    answered = files.count_lines(staged_answers + ANSWERS_FILE)
    dead_lettered = files.count_lines(staged_dead_letters + DEAD_LETTERS_FILE)
    problems = _count_problems(job, lines_in, answered, dead_lettered)
    if problems:
        raise CountsDoNotAddUp("the counts do not add up: " + "; ".join(problems) + ". Nothing was published. Fix: "
                               "rerun the date (its output is replaced whole).")
    seconds = max(job_seconds, 1e-9)
    return {
        "model": config.model.name, "input": config.batch.input, "input_files": len(inputs),
        "lines_in": lines_in, "answered": answered, "dead_lettered": dead_lettered,
        "dead_letter_reasons": job.get("dead_letter_reasons", {}), "response_tokens": job.get("response_tokens", 0),
        "job_seconds": round(job_seconds, 1), "prompts_per_s": round(answered / seconds, 3),
        "tokens_per_s": round(job.get("response_tokens", 0) / seconds, 3),
        "answers": config.batch.output + ANSWERS_FILE, "dead_letters": config.batch.dead_letter_output + DEAD_LETTERS_FILE,
    }


def publish_outputs(config: GpuflowConfig, names: ResourceNames, conn_id: str, summary: dict[str, Any]) -> None:
    """Replace the date's dead letters and answers with the run's staged ones; ``_SUCCESS`` (the summary) last."""
    files = BatchFiles(**config.hook_identity(conn_id))
    staged_answers, staged_dead_letters = staging_folders(config, names.prefix)
    files.delete(config.batch.output + SUCCESS_FILE)  # from now on, no reader takes the folder as whole
    files.replace_folder(staged_dead_letters, config.batch.dead_letter_output, [DEAD_LETTERS_FILE])
    files.replace_folder(staged_answers, config.batch.output, [ANSWERS_FILE])
    files.write_text(config.batch.output + SUCCESS_FILE, json.dumps(summary, indent=2) + "\n")
    log.info("published %s and %s (%d answered, %d dead-lettered)", summary["answers"], summary["dead_letters"],
             summary["answered"], summary["dead_lettered"])
    discard_staging(config, names, conn_id)


def discard_staging(config: GpuflowConfig, names: ResourceNames, conn_id: str) -> int:
    """Delete the run's staging folders (after publishing, or at cleanup of a run that failed); files deleted."""
    files = BatchFiles(**config.hook_identity(conn_id))
    deleted = sum(files.delete_folder(folder) for folder in staging_folders(config, names.prefix))
    if deleted:
        log.info("deleted %d staged file(s) of run %s", deleted, names.prefix)
    return deleted
