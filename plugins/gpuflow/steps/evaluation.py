"""evaluate: a lasting deployment's rollout gate, acted out. The evaluation set (``rollout.eval_set``) goes through
the serving version and the candidate with the same batches (``fixed_batching``), the whole set several rounds
(``rollout_gate.eval_rounds``) so that enough batches pair up; then the gate decides on their answers
(``gpuflow.runs.rollout_gate``), and its page is written into the deployment's folder.

gcp: each version a batch Dataflow job of the batch DAG's machinery on its own GPU type and image, both at once
(``llm_inference.py --eval-rounds``). local: ONE process holds both models and runs their batches interleaved
(``evaluate_interleaved.py``, started as ``llm_inference.py --interleaved-evaluation``), so that this machine's load
falls on both versions' measurement of a batch alike.

The jobs are the run's own: named and labelled by the run's prefix (not the deployment's), writing under the run's
folder, so that the run's cleanup, or the janitor after a killed run, stops and deletes them as any of the run's.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from gpuflow.configuration.model import ConfigError, GpuflowConfig
from gpuflow.gcs_uris import is_gcs, split_gcs_uri
from gpuflow.platform import JobBackend, JobHandle
from gpuflow.platform.files import BatchFiles
from gpuflow.runs.naming import ResourceNames, deployment_folder
from gpuflow.runs.rollout import RolloutPlan
from gpuflow.runs.rollout_gate import (
    Answer,
    EvalPrompt,
    GateDecision,
    decide,
    eval_rounds,
    parse_eval_set,
    report_markdown,
)

log = logging.getLogger(__name__)


def fixed_batching(config: GpuflowConfig, candidate: GpuflowConfig) -> GpuflowConfig:
    """``config`` with the candidate's batching, fixed at its largest batch (min_batch_size = max_batch_size), in
    the set's order: a prompt's latency is its batch's time, and Beam's BatchElements otherwise sizes batches by how
    fast the last ones went, so that two runs of one model would form different batches and compare nothing. No
    length grouping: it takes Beam's stateful batching path, whose buffering differs run to run (and, with a
    minimum batch larger than the set, trips the local runner's GroupByKey at the end of its input)."""
    batching = candidate.inference
    return config.model_copy(update={"inference": config.inference.model_copy(update={
        "min_batch_size": batching.max_batch_size, "max_batch_size": batching.max_batch_size,
        "group_by_length": False})})


class EvalVersion(BaseModel):
    """One version as its evaluation job runs it: its own configuration (its recorded job options, for the serving
    version), its model, its image."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    role: Literal["serving", "candidate"]
    config: GpuflowConfig
    names: ResourceNames  # the run's names, with this version's model folder and version id
    image: str

    @property
    def kind(self) -> str:
        return f"eval-{self.role}"


def eval_set_location(config: GpuflowConfig) -> str:
    """Where the evaluation set lies: a gs:// URI as written; on the local profile, a path relative to the state
    folder."""
    eval_set = config.rollout.eval_set or ""
    if is_gcs(eval_set) or Path(eval_set).is_absolute():
        return eval_set
    return str(Path(config.local.state_dir) / eval_set)


def read_eval_set(config: GpuflowConfig, conn_id: str) -> list[EvalPrompt]:
    """The evaluation set, checked before any job starts."""
    location = eval_set_location(config)
    text = BatchFiles(**config.hook_identity(conn_id)).read_text_if_there(location)
    if text is None:
        raise ConfigError(f"rollout.eval_set {location} is not there. Fix: upload the evaluation set there (one JSON "
                          "object per line: id, prompt, optional reference), or correct rollout.eval_set.")
    return parse_eval_set(text, location)


def evaluation_versions(config: GpuflowConfig, names: ResourceNames, rollout: RolloutPlan,
                        image: str) -> list[EvalVersion]:
    """The versions to evaluate, in the order their jobs run: what the deployment serves (if anything is recorded),
    then the run's candidate."""
    from gpuflow.steps.deployment import restored_config

    own = names.model_copy(update={"deployment": None, "job_prefix": ""})  # the run's own jobs, not the deployment's
    candidate = EvalVersion(role="candidate", config=fixed_batching(config, config), names=own, image=image)
    record = rollout.record
    if record is None:
        return [candidate]
    served = fixed_batching(restored_config(config, record), config)
    serving_names = own.model_copy(update={"model_dir_uri": record.model_dir_uri,
                                           "model_version": record.model_version})
    return [EvalVersion(role="serving", config=served, names=serving_names, image=record.image), candidate]


def answers_folder(names: ResourceNames, role: str) -> str:
    """Where a version's evaluation job writes (responses.jsonl, dead_letters.jsonl, summary.json): the run's
    folder, which its cleanup deletes."""
    return names.gcs_uri("evaluation", role) + "/"


def rounds_of(config: GpuflowConfig, conn_id: str) -> int:
    """How many times the evaluation runs the set: enough for rollout.min_latency_pairs batches (the candidate's
    fixed batch, ``fixed_batching``), at most rollout.max_rounds."""
    return eval_rounds(config.rollout, len(read_eval_set(config, conn_id)), config.inference.max_batch_size)


def evaluation_jobs(config: GpuflowConfig, versions: list[EvalVersion]) -> list[list[EvalVersion]]:
    """The versions each evaluation job runs. On Dataflow each version is a job on workers of its own (both start
    at once: a start takes minutes); locally one process runs them all, interleaved, since two would share this
    machine's processors and each would slow the other's answers."""
    return [[version] for version in versions] if config.traits.dataflow_workers else [versions]


def start_evaluation(platform: JobBackend, version: EvalVersion, config: GpuflowConfig) -> JobHandle:
    """The version's evaluation job on Dataflow: llm_inference.py in batch mode on the evaluation set, its batches
    fixed and keyed, the set run ``rounds_of`` times."""
    from gpuflow.steps.launch import pipeline_argv

    folder = answers_folder(version.names, version.role)
    argv = pipeline_argv(version.config, version.names, batch=True,
                         batch_io=["--input", eval_set_location(config), "--output", folder,
                                   "--dead-letter-output", folder,
                                   "--eval-rounds", str(rounds_of(config, platform.conn_id))])
    handle = platform.launch_pipeline(argv, version.names, version.image, streaming=False, kind=version.kind)
    log.info("evaluating the %s version %s: job %s, answers in %s", version.role, version.names.model_version,
             handle.name, folder)
    return handle


#: The kind of the local profile's one evaluation process (its job's name ends in it, its pid file too).
INTERLEAVED_KIND = "eval-interleaved"


def start_interleaved(platform: JobBackend, versions: list[EvalVersion], config: GpuflowConfig) -> JobHandle:
    """The local evaluation: one process that loads every version and runs their batches interleaved
    (``evaluate_interleaved.py``), each version's answers written into its own folder. It starts through the
    platform as ``llm_inference.py --interleaved-evaluation``, with the run's names and labels, so that cleanup, a
    kill and the janitor find and stop it as any of the run's pipeline processes."""
    from gpuflow.steps.launch import pipeline_argv

    each = [pipeline_argv(version.config, version.names, batch=True, batch_io=[
        "--input", eval_set_location(config), "--output", answers_folder(version.names, version.role),
        "--dead-letter-output", answers_folder(version.names, version.role)]) for version in versions]
    rounds = rounds_of(config, platform.conn_id)
    argv = ["--interleaved-evaluation", "--input", eval_set_location(config), "--rounds", str(rounds),
            "--batch-size", str(config.inference.max_batch_size),
            *[part for version_argv in each for part in ("--version", json.dumps(version_argv))]]
    candidate = versions[-1]
    handle = platform.launch_pipeline(argv, candidate.names, candidate.image, streaming=False, kind=INTERLEAVED_KIND)
    log.info("evaluating %s interleaved, %d rounds: job %s, answers in %s", " and ".join(
        f"the {version.role} version {version.names.model_version}" for version in versions), rounds, handle.name,
        ", ".join(answers_folder(version.names, version.role) for version in versions))
    return handle


def start_job(platform: JobBackend, versions: list[EvalVersion], config: GpuflowConfig) -> JobHandle:
    """One evaluation job of ``evaluation_jobs``."""
    if config.traits.dataflow_workers:
        (version,) = versions
        return start_evaluation(platform, version, config)
    return start_interleaved(platform, versions, config)


def read_answers(config: GpuflowConfig, conn_id: str, names: ResourceNames, role: str) -> list[Answer]:
    """A version's answer lines to the evaluation set, every round's (a dead-lettered prompt has none)."""
    folder = answers_folder(names, role)
    text = BatchFiles(**config.hook_identity(conn_id)).read_text_if_there(folder + "responses.jsonl")
    if text is None:
        raise RuntimeError(f"the {role} version's evaluation job wrote no responses.jsonl in {folder}")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def gate(config: GpuflowConfig, conn_id: str, versions: list[EvalVersion]) -> GateDecision:
    """The gate's decision on the versions' answers."""
    prompts = read_eval_set(config, conn_id)
    by_role = {version.role: (version.names.model_version,
                              read_answers(config, conn_id, version.names, version.role)) for version in versions}
    decision = decide(config.rollout, prompts, by_role["candidate"], by_role.get("serving"),
                      batch_size=config.inference.max_batch_size)
    log.info("rollout gate: %s. %s", decision.decision, decision.why)
    return decision


def write_report(config: GpuflowConfig, conn_id: str, names: ResourceNames, decision: GateDecision,
                 run_id: str) -> tuple[str, str | None]:
    """The decision's page (Markdown) in the deployment's folder, which its teardown deletes: (its gs:// URI, its
    Cloud Console URL on gcp, else None)."""
    from airflow.providers.google.cloud.hooks.gcs import GCSHook

    assert names.deployment is not None  # (a lasting deployment's run)
    uri = f"{deployment_folder(config, names.deployment)}/evaluations/{names.prefix}.md"
    bucket, name = split_gcs_uri(uri)
    GCSHook(**config.hook_identity(conn_id)).upload(bucket, name, data=report_markdown(
        decision, names.deployment, run_id), mime_type="text/markdown")
    if not config.traits.dataflow_workers:
        return uri, None
    # The provider's own link to an object's page (its FileDetailsLink's), loaded here, in the task, not at parse.
    from airflow.providers.google.common.links.storage import GCS_FILE_DETAILS_LINK

    return uri, GCS_FILE_DETAILS_LINK.format(uri=f"{bucket}/{name}", project_id=config.project)
