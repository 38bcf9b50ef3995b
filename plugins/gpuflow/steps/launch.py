"""launch: start the inference pipeline (streaming, or a batch job), and move to a fallback placement when its zone
has no GPUs."""

from __future__ import annotations

import logging

from gpuflow.configuration.model import GpuflowConfig
from gpuflow.dataflow.gpu_options import accelerator_hint, right_fitting
from gpuflow.platform import JobHandle
from gpuflow.runs.naming import ResourceNames
from gpuflow.steps.placements import Placement, fallback_configs, next_placement, worth_a_fallback

log = logging.getLogger(__name__)


def pipeline_argv(config: GpuflowConfig, names: ResourceNames, batch: bool = False,
                  batch_io: list[str] | None = None) -> list[str]:
    """The llm_inference.py arguments both profiles share; the platform adds the runner's options.

    Streaming: the run's Pub/Sub topics. Batch: the interval's input, and the run's staging folders, which the DAG
    publishes once the job has succeeded (``gpuflow.steps.batch``); or ``batch_io``'s (a rollout's evaluation)."""
    project = config.project
    if batch and batch_io:
        io = batch_io
    elif batch:
        from gpuflow.runs.batch_paths import staging_folders

        answers, dead_letters = staging_folders(config, names.prefix)
        io = ["--input", config.batch.input, "--output", answers, "--dead-letter-output", dead_letters]
    else:
        io = ["--messages-subscription", f"projects/{project}/subscriptions/{names.prompts_subscription}",
              "--responses-topic", f"projects/{project}/topics/{names.responses_topic}",
              "--dead-letter-topic", f"projects/{project}/topics/{names.dead_letter_topic}"]
    argv = [
        "--model-name", names.model_dir_uri,
        "--model-label", config.model.name,
        "--architecture", config.model.architecture,
        "--state-dict-path", names.state_dict_uri,
        "--max-new-tokens", str(config.model.max_new_tokens),
        "--max-input-tokens", str(config.model.max_input_tokens),
        "--dtype", config.model.dtype,
        "--min-batch-size", str(config.inference.min_batch_size),
        "--max-batch-size", str(config.inference.max_batch_size),
        "--max-batch-duration-secs", str(config.inference.max_batch_duration_secs),
        *io,
    ]
    if config.require_gpu:
        argv.append("--require-gpu")
    if config.inference.group_by_length:
        argv.append("--group-by-length")
    if config.model.chat_template:
        argv.append("--chat-template")
    if config.inference.engine == "vllm":
        argv += ["--engine", "vllm", "--vllm-gpu-memory-utilization", str(config.inference.vllm_gpu_memory_utilization)]
    if right_fitting(config) and config.traits.resource_hints:
        argv += ["--accelerator-hint", accelerator_hint(config)]
    if config.gpu.sharing == "model_copies":
        argv += ["--model-copies", str(config.gpu.model_copies)]
    argv += ["--model-version", names.model_version]
    if names.deployment and not batch:
        from gpuflow.runs.naming import pointer_folder

        # RunInference's automatic model refresh: the job switches to each new version pointer written there.
        argv += ["--model-refresh-folder", pointer_folder(config, names.deployment),
                 "--model-refresh", config.traits.model_refresh,
                 "--model-refresh-interval-s", str(config.deployment.refresh_interval_s)]
    return argv


def start_next_placement(config: GpuflowConfig, names: ResourceNames, image: str, after: int,
                         failures: list[str], batch: bool = False) -> tuple[Placement, JobHandle]:
    """Start the pipeline on the first placement after number ``after`` that preflight accepts: the configuration
    itself, then each ``gpu.fallbacks`` entry. The task defers until the job runs (or, a batch job, is done)."""
    from gpuflow.platform import get_platform
    from gpuflow.steps.quota import check_quota

    placement = next_placement(config, after, failures)
    platform = get_platform(placement.config)
    if placement.config.traits.gpu_quota:  # again, right before the start: another run may have taken GPUs since
        check_quota(placement.config, platform)
    return placement, platform.launch_pipeline(pipeline_argv(placement.config, names, batch), names, image,
                                               streaming=not batch)


def placement_config(config: GpuflowConfig, number: int) -> GpuflowConfig:
    """The configuration of placement ``number`` (1: the configuration itself)."""
    return [config, *fallback_configs(config)][number - 1]


def after_failed_start(config: GpuflowConfig, number: int, handle: JobHandle, message: str,
                       failures: list[str]) -> bool:
    """Stop the job that did not start; True when the next placement may fix what stopped it (an exhausted zone)."""
    from gpuflow.platform import get_platform

    candidate = placement_config(config, number)
    get_platform(candidate).stop_pipeline(handle)
    return worth_a_fallback(Placement(number, 1 + len(config.gpu.fallbacks), candidate), message, failures)
