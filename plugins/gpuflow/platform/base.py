"""The backends that differ by profile (export, image, jobs, GPUs), narrow protocols each, and the job handle that
crosses tasks."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel

from gpuflow.configuration.model import GpuflowConfig
from gpuflow.platform.access_facts import AccessProbe
from gpuflow.runs.naming import ResourceNames

#: The region's zones that offer a GPU type now: ``(gpu_type, region) -> zones``.
ZonesOffering = Callable[[str, str], list[str]]


class JobHandle(BaseModel):
    """The one object that crosses tasks (through XCom): enough to find and stop a running job."""

    kind: Literal["local-process", "dataflow", "vertex-custom-job", "cloud-build"]
    id: str
    name: str
    location: str
    url: str | None = None  # the console page of the job, for the operator's extra link

    def to_xcom(self) -> dict[str, Any]:
        return self.model_dump()


class ImageBuildResult(BaseModel):
    image: str
    built: bool
    context_dir: str
    detail: str
    job: JobHandle | None = None  # a remote build still running (its task defers until it ends)


class Backend(Protocol):
    """What every backend carries: the run's configuration, and the Airflow connection its hooks use."""

    config: GpuflowConfig
    conn_id: str


class ExportBackend(Backend, Protocol):
    """The model export: a Vertex AI custom job (gcp), or download_model.py here (local)."""

    def export_model(self, model_name: str, names: ResourceNames) -> JobHandle | None:
        """Write the model's bf16 state_dict (and config, tokenizer) under ``names``.

        A remote export (Vertex AI) is only started: its handle comes back, and the task defers until it ends.
        The local export runs to its end here and returns None."""

    def cancel_export(self, job_name: str) -> None:
        """Cancel a remote export job (on_kill); the local profile has none."""

    def find_export(self, names: ResourceNames) -> JobHandle | None:
        """The run's remote export that an earlier try started and that still runs, found by its name and labels;
        None when there is none (the local profile's export runs in the task)."""


class ImageBackend(Backend, Protocol):
    """The worker image: Cloud Build into Artifact Registry (gcp), or a Docker engine where one answers (local)."""

    def build_image(self, context_dir: Path, image: str, names: ResourceNames) -> ImageBuildResult:
        """Build the worker container from a rendered context, or say plainly why it was not built.

        A remote build (Cloud Build) is only started: the result carries its ``job``, and the task defers."""

    def cancel_build(self, build_id: str) -> None:
        """Cancel a remote build (on_kill); the local profile has none."""


class JobBackend(Backend, Protocol):
    """The Beam jobs (the GPU check, the inference pipeline) by their handles: Dataflow jobs (gcp), or processes on
    the local runner. Each is started without waiting; its task defers on the trigger for its handle
    (``gpuflow.triggers``)."""

    def start_gpu_check(self, names: ResourceNames, image: str) -> JobHandle:
        """Start beam_jobs/gpu_check.py where the workers run; the task defers until it is done."""

    def gpu_check_report(self, names: ResourceNames, handle: JobHandle) -> dict[str, Any]:
        """The report the finished GPU check wrote, or an error with the job's own reason."""

    def find_gpu_check(self, names: ResourceNames) -> JobHandle | None:
        """The run's GPU check that an earlier try started, found by its name: still running, or (local) ended
        well; None when there is none to wait on (then a new one starts)."""

    def launch_pipeline(self, argv: list[str], names: ResourceNames, image: str, streaming: bool = True,
                        kind: str = "") -> JobHandle:
        """Start the inference pipeline, streaming or batch; return as soon as its handle exists (the task defers
        until it runs, or a batch job until it is done). ``kind`` names a job that is not the run's pipeline (a
        rollout's evaluation jobs: ``eval-serving``, ``eval-candidate``), so that it has a name of its own."""

    def job_timeout_s(self, until: str) -> float:
        """How long a job of this profile may take to reach ``until`` (running, done or stopped)."""

    def request_stop(self, handle: JobHandle, drain: bool | None = None) -> bool:
        """Ask the job to stop without waiting (``drain``: finish what it holds; None: dataflow.stop_action);
        True if it was still running."""

    def job_running(self, handle: JobHandle) -> bool:
        """The job still runs (a deployment's recorded job, before a rollout plans around it)."""

    def update_pipeline(self, argv: list[str], names: ResourceNames, image: str, job_name: str,
                        transform_name_mapping: dict[str, str]) -> JobHandle:
        """Replace the running streaming job ``job_name`` in place (Dataflow's update; ``config.traits``)."""

    def stop_pipeline(self, handle: JobHandle) -> bool:
        """Stop the job and wait (bounded) until it has; True if it was still running."""


class JobFinder(JobBackend, Protocol):
    """The jobs found without a handle, by their names and labels, to stop them: a run's cleanup after a failed
    launch, the janitor, a deployment's teardown."""

    def find_gpuflow_jobs(self) -> list[JobHandle]:
        """Every running gpuflow job of the project (the janitor's view), named by its run or deployment."""

    def job_labels(self, handle: JobHandle) -> dict[str, str]:
        """The labels the job was started with (``gpuflow-run``, ``gpuflow-deployment``): the janitor's proof."""

    def find_run_jobs(self, names: ResourceNames) -> list[JobHandle]:
        """Jobs of this run found without a handle (for cleanup after a failed launch)."""


class GpuBackend(Backend, Protocol):
    """What is known of the GPUs: quota and zones (Compute Engine) or this machine's devices, and their usage."""

    @property
    def zones_offering(self) -> ZonesOffering | None:
        """Which of the region's zones offer a GPU type now (gcp: Compute Engine); None where no service says so,
        and preflight reads the catalog's table."""

    def gpu_usage(self, handle: JobHandle | None, started: float, ended: float) -> dict[str, Any] | None:
        """How busy the GPUs were over [started, ended] (epoch seconds), when it can be read at once (nvidia-smi);
        None when it is read while the task defers (gcp: Cloud Monitoring, in gpuflow.triggers.monitoring)."""

    def gpu_capacity(self) -> dict[str, Any]:
        """GPUs this profile can use: local devices, or regional quota headroom."""

    def access_probe(self, impersonation_chain: list[str] | None = None) -> AccessProbe | None:
        """What preflight's access rules read of the project (``gpuflow.platform.access_facts.AccessProbe``): its
        APIs, the caller's permissions, the workers' service account, its policies, the bucket, as the connection's
        identity or the last account of ``impersonation_chain``. None where there is no cloud project to read
        (local)."""


class Platform(ExportBackend, ImageBackend, JobFinder, GpuBackend, Protocol):
    """A profile's backends together, with what they share: the configuration, the connection, the environment.
    Each step takes the narrow backend it uses; only the operators hold the whole platform."""

    def environment(self) -> contextlib.AbstractContextManager[Any]:
        """What must be set in this process while hooks and subprocesses run."""
