"""launch: start the streaming inference pipeline and wait until it runs."""

from __future__ import annotations

import logging
from collections.abc import Callable

from gpuflow.config import GpuflowConfig
from gpuflow.naming import ResourceNames
from gpuflow.platform import JobHandle, Platform

log = logging.getLogger(__name__)


def pipeline_argv(config: GpuflowConfig, names: ResourceNames) -> list[str]:
    """The llm_inference.py arguments both profiles share; the platform adds the runner's options."""
    project = config.project
    argv = [
        "--model-name", names.model_dir_uri,
        "--state-dict-path", names.state_dict_uri,
        "--max-new-tokens", str(config.model.max_new_tokens),
        "--max-input-tokens", str(config.model.max_input_tokens),
        "--dtype", config.model.dtype,
        "--min-batch-size", str(config.inference.min_batch_size),
        "--max-batch-size", str(config.inference.max_batch_size),
        "--max-batch-duration-secs", str(config.inference.max_batch_duration_secs),
        "--messages-subscription", f"projects/{project}/subscriptions/{names.prompts_subscription}",
        "--responses-topic", f"projects/{project}/topics/{names.responses_topic}",
        "--dead-letter-topic", f"projects/{project}/topics/{names.dead_letter_topic}",
    ]
    if config.require_gpu:
        argv.append("--require-gpu")
    if config.inference.group_by_length:
        argv.append("--group-by-length")
    if config.gpu.request == "resource_hint" and config.profile == "gcp":
        from gpuflow.gpu_options import accelerator_hint

        argv += ["--accelerator-hint", accelerator_hint(config)]
    if config.gpu.sharing == "model_copies":
        argv += ["--model-copies", str(config.gpu.model_copies)]
    return argv


def launch(
    config: GpuflowConfig, names: ResourceNames, platform: Platform, image: str = "",
    on_handle: Callable[[JobHandle], None] | None = None,
) -> JobHandle:
    """Start the pipeline, report its handle at once (``on_handle``), then wait until it runs.

    When the workers cannot start for lack of GPUs in the zone (ZONE_RESOURCE_POOL_EXHAUSTED), the
    configured ``gpu.fallbacks`` are tried in order, each checked by preflight first.
    """
    from gpuflow.platform import get_platform
    from gpuflow.troubleshoot import run_with_fallbacks

    def attempt(candidate: GpuflowConfig) -> JobHandle:
        target = platform if candidate is config else get_platform(candidate)
        handle = target.launch_pipeline(pipeline_argv(candidate, names), names, image)
        if on_handle:
            on_handle(handle)
        try:
            target.wait_until_running(handle)
        except BaseException:
            target.stop_pipeline(handle)
            raise
        return handle

    return run_with_fallbacks(config, attempt)
