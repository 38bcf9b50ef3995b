"""How a persistent deployment changes: its record, and which rollout path a run's change takes, and why.

Pure rules over the configuration and the deployment's record (``gpuflow.platform.records`` reads and writes
it); the steps act on the plan (``gpuflow.steps.deployment``).

The paths:

* ``new``: no deployment yet (or its job no longer runs): start its job.
* ``weights``: the image and the job's options are unchanged, so only the model changes: RunInference's automatic
  model refresh switches the running job to the new version (a pointer file in the folder it watches).
* ``update``: Dataflow replaces the job in place, under the same name ("Update an existing pipeline",
  https://cloud.google.com/dataflow/docs/guides/updating-a-pipeline: a replacement job, after a compatibility
  check that state and buffered data can move). gpuflow takes this path only when the job graph and its worker
  pool stay the same (``UPDATABLE``): a new image (code and libraries), batch sizes, token limits, the worker ceiling.
* ``replace``: anything else (the GPU, the machine, the region, the model's type, the batching's shape): a new job
  starts on the same subscription, answers the smoke test, and only then is the old one drained.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, Field

from gpuflow.configuration.model import GpuflowConfig

#: The configuration keys that shape a deployment's job; any change among them needs a new job (update or replace).
JOB_KEYS = (
    "region", "require_gpu", "dataflow_service_options", "beam_version", "python_version",
    "model.name", "model.architecture", "model.chat_template", "model.dtype", "model.max_new_tokens",
    "model.max_input_tokens",
    "gpu.type", "gpu.count", "gpu.machine_type", "gpu.zone", "gpu.request", "gpu.sharing", "gpu.model_copies",
    "worker.machine_type", "worker.disk_size_gb", "worker.max_num_workers",
    "container.recipe", "container.image",
    "dataflow.service_account", "dataflow.experiments", "dataflow.network", "dataflow.subnetwork",
    "launch.mode",
    "inference.engine", "inference.vllm_gpu_memory_utilization", "inference.min_batch_size",
    "inference.max_batch_size", "inference.max_batch_duration_secs", "inference.group_by_length",
    "deployment.refresh_interval_s",
)
#: Of those, the ones a Dataflow update in place may change: the graph's transforms and the worker pool's shape
#: stay as they were. (The image is compared apart: a new image is new code, which an update carries.)
UPDATABLE = frozenset({
    "beam_version", "python_version", "container.recipe", "container.image",
    "model.max_new_tokens", "model.max_input_tokens",
    "inference.min_batch_size", "inference.max_batch_size", "inference.max_batch_duration_secs",
    "worker.max_num_workers", "deployment.refresh_interval_s",
})

Path = Literal["new", "weights", "update", "replace"]


class DeploymentRecord(BaseModel):
    """What a deployment serves now. Written whole and atomically by the run that changed it (or rolled back)."""

    name: str
    job: dict[str, Any]  # the serving job's handle (JobHandle.to_xcom())
    job_name: str
    subscription: str  # the prompts subscription the job reads
    image: str
    model_version: str  # the id its answers carry
    model_dir_uri: str
    state_dict_uri: str
    options: dict[str, Any]  # JOB_KEYS -> value, as the job was started with
    changed_at: float = Field(default_factory=time.time)
    changed_by: str = ""  # the DAG run that made this the deployment's state
    url: str | None = None  # the job's console page
    config_file: str = ""  # the configuration file the deployment was made from: only a run of it may change it
    # the rollout gate that let this version in: both versions' scores and latencies, and the decision
    # (gpuflow.runs.rollout_gate.GateDecision's JSON; None without rollout.eval_set)
    evaluation: dict[str, Any] | None = None


def owner_problem(record: DeploymentRecord | None, config: GpuflowConfig, what: str) -> str | None:
    """Why a run of ``config`` may not change (``what``: roll out onto, tear down) the deployment ``record`` names:
    a deployment belongs to the configuration file it was made from, so one team cannot act on another's through
    its own file. A record from before gpuflow wrote owners (none named) may be changed, and then names this file."""
    if record is None or not record.config_file or record.config_file == config.source_file:
        return None
    return (f"deployment {record.name} was made from the configuration file {record.config_file}, and this run's is "
            f"{config.source_file}: a run may {what} only a deployment of its own configuration file. Fix: trigger "
            f"the run with config_file {record.config_file} (its owners' file), or pick another deployment.name.")


class RolloutPlan(BaseModel):
    path: Path
    why: str
    changed: list[str] = []  # the JOB_KEYS that differ from the record (and "image")
    record: DeploymentRecord | None = None  # what served before this run

    @property
    def served(self) -> DeploymentRecord:
        """What served before this run, on the paths that change a serving deployment (weights, update)."""
        if self.record is None:
            raise ValueError(f"the {self.path} path has no serving deployment recorded")
        return self.record


def job_options(config: GpuflowConfig) -> dict[str, Any]:
    """The configuration's JOB_KEYS, as JSON values (launch.mode as the profile resolves an empty one)."""
    dumped = config.model_dump(mode="json")
    dumped["launch"]["mode"] = config.launch_mode
    options = {}
    for key in JOB_KEYS:
        value: Any = dumped
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        options[key] = value
    return options


def plan_rollout(config: GpuflowConfig, record: DeploymentRecord | None, image: str, job_running: bool) -> RolloutPlan:
    """Which path this run's change takes, and why (preflight logs it; launch, smoke_test and promote follow it)."""
    if record is None:
        return RolloutPlan(path="new", why="no deployment of this name is recorded: its first job starts")
    if not job_running:
        return RolloutPlan(path="replace", record=record,
                           why=f"the recorded job {record.job_name} no longer runs: a new job takes over its "
                               "subscription")
    options = job_options(config)
    changed = sorted(key for key in JOB_KEYS if options[key] != record.options.get(key))
    if image != record.image:
        changed.append("image")
    if not changed:
        return RolloutPlan(path="weights", record=record,
                           why="the image and the job's options are unchanged: only the weights change, and the "
                               f"running job {record.job_name} switches to the new version by RunInference's "
                               "automatic model refresh, without a restart")
    listed = ", ".join(changed)
    fixed = [key for key in changed if key != "image" and key not in UPDATABLE]
    if fixed:
        return RolloutPlan(path="replace", record=record, changed=changed,
                           why=f"changed: {listed}; {', '.join(fixed)} change the job's graph or worker pool, which "
                               "an update in place cannot: a new job starts on the same subscription, and the old "
                               "one is drained once the new one answers")
    if not config.traits.updates_in_place:
        return RolloutPlan(path="replace", record=record, changed=changed,
                           why=f"changed: {listed}; the local DirectRunner cannot update a job in place, so a new "
                               "job replaces it")
    return RolloutPlan(path="update", record=record, changed=changed,
                       why=f"changed: {listed}; the job graph and worker pool are unchanged, so Dataflow updates "
                           f"{record.job_name} in place (same name, --update)")


def pointer_name(version: str, written_at: float | None = None) -> str:
    """A model version pointer's file name: when it was written first (zero-padded epoch seconds, so names sort by
    time, as the pipeline reads them: llm_handlers.pointer_written_at), then the version."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in version)
    return f"{written_at or time.time():017.6f}-{safe}.json"
