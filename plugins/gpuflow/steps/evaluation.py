"""evaluate: a lasting deployment's rollout gate, acted out. The evaluation set (``rollout.eval_set``) goes through
the serving version and the candidate, each as a batch job of the batch DAG's own machinery (gcp: a batch Dataflow
job on the version's GPU type and image; local: the batch runner, one at a time) with the same batches
(``fixed_batching``); then the gate decides on their answers (``gpuflow.runs.rollout_gate``), and its page is
written into the deployment's folder.

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
from gpuflow.runs.rollout_gate import Answer, EvalPrompt, GateDecision, decide, parse_eval_set, report_markdown

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


def start_evaluation(platform: JobBackend, version: EvalVersion, config: GpuflowConfig) -> JobHandle:
    """The version's evaluation job: llm_inference.py in batch mode on the evaluation set."""
    from gpuflow.steps.launch import pipeline_argv

    folder = answers_folder(version.names, version.role)
    argv = pipeline_argv(version.config, version.names, batch=True,
                         batch_io=["--input", eval_set_location(config), "--output", folder,
                                   "--dead-letter-output", folder])
    handle = platform.launch_pipeline(argv, version.names, version.image, streaming=False, kind=version.kind)
    log.info("evaluating the %s version %s: job %s, answers in %s", version.role, version.names.model_version,
             handle.name, folder)
    return handle


def read_answers(config: GpuflowConfig, conn_id: str, names: ResourceNames, role: str) -> dict[str, Answer]:
    """A version's answers to the evaluation set, by prompt id (a dead-lettered prompt has none)."""
    folder = answers_folder(names, role)
    text = BatchFiles(**config.hook_identity(conn_id)).read_text_if_there(folder + "responses.jsonl")
    if text is None:
        raise RuntimeError(f"the {role} version's evaluation job wrote no responses.jsonl in {folder}")
    answers = [json.loads(line) for line in text.splitlines() if line.strip()]
    return {str(answer["id"]): answer for answer in answers}


def gate(config: GpuflowConfig, conn_id: str, versions: list[EvalVersion]) -> GateDecision:
    """The gate's decision on the versions' answers."""
    prompts = read_eval_set(config, conn_id)
    by_role = {version.role: (version.names.model_version,
                              read_answers(config, conn_id, version.names, version.role)) for version in versions}
    decision = decide(config.rollout, prompts, by_role["candidate"], by_role.get("serving"))
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
