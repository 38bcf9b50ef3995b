"""Preflight: the configuration rules (the configuration alone), and which rules each workflow and profile runs
(environment rules, about this machine, are ``environment_rules``; GPU, image, access and pool rules their own)."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gpuflow.configuration.model import DEMO_MODEL_NAME, DEMO_MODELS, GpuflowConfig
from gpuflow.platform.access_facts import AccessProbe
from gpuflow.preflight.access_rules import access_findings
from gpuflow.preflight.composer_rules import composer_findings
from gpuflow.preflight.dataproc_rules import dataproc_findings
from gpuflow.preflight.engine_rules import vllm_engine, vllm_runs_here
from gpuflow.preflight.environment_rules import (
    airflow_at_floor,
    emulators_answer,
    gcp_connection_defined,
    java_for_local_spark,
    launch_environment_matches_container,
)
from gpuflow.preflight.findings import Finding, error, warning
from gpuflow.preflight.gpu_rules import (
    CPU_RULES,
    GPU_RULES,
    ZonesOffering,
    region_offers_gpu,
    region_offers_gpu_now,
    streaming_right_fitting_autoscales,
)
from gpuflow.preflight.image_rules import IMAGE_RULES, export_lock
from gpuflow.preflight.limit_rules import limit_findings
from gpuflow.preflight.pool_rules import PoolReader, pool_findings

Rule = Callable[[GpuflowConfig], Iterator[Finding]]


# -- configuration rules -------------------------------------------------------------------------


#: Project ids that are gpuflow's own placeholders, never a real project.
PLACEHOLDER_PROJECTS = {"gpuflow-local", "my-gcp-project"}


def gcp_project_is_real(config: GpuflowConfig) -> Iterator[Finding]:
    if config.project in PLACEHOLDER_PROJECTS:
        yield error("project", f"{config.project!r} is gpuflow's placeholder, not your Google Cloud project",
                    "set project to your project id (gcloud config get-value project)")


#: A service account's email: NAME@PROJECT.iam.gserviceaccount.com, or Google's own kinds (the Compute Engine default
#: account, PROJECT_NUMBER-compute@developer.gserviceaccount.com).
SERVICE_ACCOUNT_EMAIL = re.compile(r"^[a-z0-9][a-z0-9-]*@[a-z0-9][a-z0-9.-]*\.gserviceaccount\.com$")


def service_account_well_formed(config: GpuflowConfig) -> Iterator[Finding]:
    """Dataflow takes only a service account's email; anything else fails the launch after setup and export."""
    account = config.dataflow.service_account
    if account and not SERVICE_ACCOUNT_EMAIL.match(account):
        yield error("dataflow.service_account", f"{account!r} is not a service account's email",
                    f"set dataflow.service_account to NAME@{config.project}.iam.gserviceaccount.com (gcloud iam "
                    f"service-accounts list --project={config.project}), or leave it empty for Compute Engine's "
                    "default account")


def dotted_bucket_needs_verification(config: GpuflowConfig) -> Iterator[Finding]:
    """Cloud Storage creates a bucket whose name holds a dot only for a verified owner of the domain it names
    (cloud.google.com/storage/docs/naming-buckets: "Bucket names containing dots require verification"), whatever
    its length."""
    if config.bucket and "." in config.bucket:
        yield warning("bucket", f"{config.bucket!r} holds a dot: Cloud Storage creates such a bucket only for a "
                      "verified owner of its domain (Search Console), at any length",
                      "use the bucket only if it exists or your project owns the domain; else pick a name without "
                      "dots")


def gcp_runs_on_gpu(config: GpuflowConfig) -> Iterator[Finding]:
    if not config.require_gpu:
        yield warning("require_gpu", "on Google Cloud a worker without a working GPU would still run (on CPU) and "
                      "bill for the GPU it cannot use", "set require_gpu: true")


def batch_sizes_ordered(config: GpuflowConfig) -> Iterator[Finding]:
    if config.inference.min_batch_size > config.inference.max_batch_size:
        yield error(
            "inference.min_batch_size",
            f"min_batch_size {config.inference.min_batch_size} is above max_batch_size "
            f"{config.inference.max_batch_size}",
            "lower inference.min_batch_size or raise inference.max_batch_size",
        )


def streaming_batches_across_bundles(config: GpuflowConfig) -> Iterator[Finding]:
    if config.inference.max_batch_duration_secs == 0 and config.inference.max_batch_size > 1:
        yield warning(
            "inference.max_batch_duration_secs",
            "0 batches only within a bundle; Dataflow streaming bundles often hold one prompt, so the GPU "
            "would see batches of 1",
            "set inference.max_batch_duration_secs to about 1 second",
        )


def gpu_worker_disk(config: GpuflowConfig) -> Iterator[Finding]:
    if config.worker.disk_size_gb < 50:
        yield error(
            "worker.disk_size_gb",
            f"{config.worker.disk_size_gb} GB is too small for a GPU container image (CUDA and torch)",
            "set worker.disk_size_gb to 50 or more",
        )


def model_name_resolvable(config: GpuflowConfig) -> Iterator[Finding]:
    name = config.model.name
    if name in DEMO_MODELS or name.startswith("gs://"):
        return
    looks_like_path = name.startswith(("/", ".", "~"))
    if looks_like_path and not (Path(name).expanduser() / "config.json").exists():
        yield error(
            "model.name",
            f"{name} is not a Hugging Face model directory (no config.json there)",
            f"point model.name at a directory written by save_pretrained, or use '{DEMO_MODEL_NAME}'",
        )


def hub_model_cached_locally(config: GpuflowConfig) -> Iterator[Finding]:
    name = config.model.name
    if name in DEMO_MODELS or name.startswith(("gs://", "/", ".", "~")) or Path(name).exists():
        return
    yield warning(
        "model.name",
        f"{name} looks like a hub name; the local profile can only load it if it is in the Hugging Face cache",
        f"use a local directory or '{DEMO_MODEL_NAME}' on machines without internet access",
    )


def demo_model_is_local_only(config: GpuflowConfig) -> Iterator[Finding]:
    if config.model.name in DEMO_MODELS:
        yield error("model.name", f"'{config.model.name}' is built on the local machine; the gcp profile exports a "
                    "model in a Vertex AI job", "set model.name to a Hugging Face hub model, e.g. google/flan-t5-small")


def batch_paths_on_gcs(config: GpuflowConfig) -> Iterator[Finding]:
    batch = config.batch
    for key, path in (("batch.input", batch.input), ("batch.output", batch.output),
                      ("batch.dead_letter_output", batch.dead_letter_output)):
        if not path.startswith("gs://"):
            yield error(key, f"{path!r} is no gs:// path, and Dataflow workers cannot read this machine's disk",
                        f"set {key} to a gs://BUCKET/... path")


def batch_locations_usable(config: GpuflowConfig) -> Iterator[Finding]:
    """The batch DAG's paths (filled for the run): reachable by the workers, and never one inside another."""
    batch = config.batch
    paths = {"batch.input": batch.input, "batch.output": batch.output,
             "batch.dead_letter_output": batch.dead_letter_output}
    for key, path in paths.items():
        if key != "batch.input" and any(mark in path for mark in "*?["):
            yield error(key, f"{path!r} is a folder to write, not a glob", f"set {key} to a folder without wildcards")
    folders = {"batch.output": batch.output, "batch.dead_letter_output": batch.dead_letter_output}
    if batch.output.startswith(batch.dead_letter_output) or batch.dead_letter_output.startswith(batch.output):
        yield error("batch.dead_letter_output", f"{batch.dead_letter_output!r} and batch.output {batch.output!r} "
                    "overlap, and publishing one replaces the other's folder whole",
                    "give the dead letters a folder of their own (default gs://{bucket}/dead_letters/{ds}/)")
    for key, folder in folders.items():
        if batch.input.startswith(folder):
            yield error("batch.input", f"{batch.input!r} lies in {key} {folder!r}, which each run replaces",
                        "keep the prompts outside the output folders")


CONFIG_RULES: list[Rule] = [
    vllm_engine,
    gcp_project_is_real,
    service_account_well_formed,
    dotted_bucket_needs_verification,
    gcp_runs_on_gpu,
    batch_sizes_ordered,
    streaming_batches_across_bundles,
    gpu_worker_disk,
    model_name_resolvable,
    hub_model_cached_locally,
    *GPU_RULES,
    *IMAGE_RULES,
    dataproc_findings,
]


def persistent_deployment_usable(config: GpuflowConfig) -> Iterator[Finding]:
    """deployment.mode persistent: what a lasting deployment needs."""
    if config.deployment.mode != "persistent":
        return
    if not config.bucket:
        yield error("bucket", "a persistent deployment keeps its model versions and (on gcp) its record in the "
                    "bucket, and a run without one makes a bucket of its own that its cleanup deletes",
                    "set bucket to a bucket that stays")
    if config.export.model_dir:
        yield warning("export.model_dir", "a persistent deployment exports each run's version into its own "
                      "versions folder; export.model_dir is not used", "leave export.model_dir empty")
    eval_set = config.rollout.eval_set
    if eval_set and config.traits.dataflow_workers and not eval_set.startswith("gs://"):
        yield error("rollout.eval_set", f"{eval_set} is not in Cloud Storage: the evaluation jobs run on Dataflow "
                    "workers, which read gs:// URIs only", "upload the set to the bucket and name its gs:// URI")
    if config.inference.engine == "vllm":
        yield error("inference.engine", "the vLLM handler cannot switch model versions in a running job (it has no "
                    "update_model_path), so a weights rollout would never take over",
                    "use inference.engine: transformers for a persistent deployment, or deployment.mode: ephemeral")


#: Configuration rules that only one workflow's tasks make true (the Dataproc batch exports no model).
WORKFLOW_CONFIG_RULES: dict[str, list[Rule]] = {
    "inference": [demo_model_is_local_only, streaming_right_fitting_autoscales, persistent_deployment_usable],
    # Right fitting is supported for batch pipelines without conditions (docs.cloud.google.com/dataflow/docs/guides/
    # right-fitting, "Support and limitations"), so the streaming rule is not among the batch's.
    "batch": [demo_model_is_local_only, batch_locations_usable, batch_paths_on_gcs],
    "dataproc": [],
    "maintenance": [],
    "quota_report": [],
}

#: Workflows that start no Dataflow job, whose configuration rules are their own: the teardown and the janitor start
#: no job at all, and the Dataproc batch loads no model on Dataflow workers, so Dataflow's GPU, image and model rules
#: (the SDK processes' model copies, the container's CUDA line) would only mislead there.
OWN_CONFIG_RULES: dict[str, list[Rule]] = {
    "maintenance": [gcp_project_is_real],
    "quota_report": [gcp_project_is_real],  # it reads quotas, and starts nothing
    "dataproc": [gcp_project_is_real, dataproc_findings],
}

#: What each workflow needs of the machine it runs on.
ENVIRONMENT_RULES: dict[str, list[Rule]] = {
    "inference": [airflow_at_floor, gcp_connection_defined, launch_environment_matches_container, emulators_answer,
                  vllm_runs_here],
    "batch": [airflow_at_floor, gcp_connection_defined, launch_environment_matches_container, emulators_answer,
              vllm_runs_here],
    "dataproc": [airflow_at_floor, java_for_local_spark],
    "maintenance": [airflow_at_floor, gcp_connection_defined, emulators_answer],
    "quota_report": [airflow_at_floor, gcp_connection_defined],
}


#: The rules of one profile only: run_preflight drops the other profile's (the one place preflight picks by profile;
#: the rules themselves never ask).
PROFILE_RULES: dict[str, set[Rule]] = {
    "gcp": {gcp_project_is_real, service_account_well_formed, gcp_runs_on_gpu, demo_model_is_local_only,
            batch_paths_on_gcs, gcp_connection_defined, export_lock, dotted_bucket_needs_verification},
    "local": {hub_model_cached_locally, emulators_answer, java_for_local_spark, vllm_runs_here},
}


def run_preflight(config: GpuflowConfig, check_environment: bool = True, workflow: str = "inference",
                  zones_offering: ZonesOffering | None = None, access: AccessProbe | None = None,
                  gpu_pool: tuple[str, PoolReader] | None = None,
                  composer_environment: dict[str, Any] | None = None) -> list[Finding]:
    """Every rule of the workflow. ``zones_offering`` (gcp, from the platform): the region check asks Compute
    Engine instead of reading the offline table. ``access`` (gcp, from the platform): the project's APIs, IAM,
    service account, policies and bucket are checked too (``access_rules``). ``gpu_pool`` (the pool's name and a
    reader, where Airflow's pools can be read: on Composer): the GPU tasks' pool must exist (``pool_rules``).
    ``composer_environment`` (on Composer, what was read of the environment): its image floor and its triggerer
    (``composer_rules``)."""
    config_rules = OWN_CONFIG_RULES.get(workflow, CONFIG_RULES)
    rules: list[Any] = [*config_rules, *WORKFLOW_CONFIG_RULES[workflow],
                        *(ENVIRONMENT_RULES[workflow] if check_environment else [])]
    others = set().union(*(own for profile, own in PROFILE_RULES.items() if profile != config.profile))
    rules = [rule for rule in rules if rule not in others]
    if not config.uses_gpu and config_rules is CONFIG_RULES:  # CPU workers: the CPU rules in place of the GPU ones
        rules = [rule for rule in rules if rule not in (*GPU_RULES, gcp_runs_on_gpu)] + CPU_RULES
    if zones_offering is not None:
        rules = [functools.partial(region_offers_gpu_now, zones_offering=zones_offering) if rule is region_offers_gpu
                 else rule for rule in rules]
    findings = [finding for rule in rules for finding in rule(config)]
    findings += limit_findings(config, workflow)
    if access is not None:
        findings += access_findings(config, workflow, access)
    if gpu_pool is not None:
        findings += pool_findings(workflow, *gpu_pool)
    if composer_environment is not None:
        findings += composer_findings(composer_environment)
    return findings
