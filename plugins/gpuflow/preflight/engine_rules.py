"""inference.engine: vllm. Beam's VLLMCompletionsModelHandler runs vLLM's server on a GPU worker; what it needs of
the configuration and the machine, each finding with its fix."""

from __future__ import annotations

from collections.abc import Iterator

from gpuflow import catalog
from gpuflow.configuration.model import DEMO_MODELS, GpuflowConfig
from gpuflow.dataflow.gpu_options import kv_cache_gb, model_parameters_m
from gpuflow.preflight.findings import Finding, error


def _is_seq2seq(config: GpuflowConfig) -> bool:
    if config.model.architecture != "auto":
        return config.model.architecture == "seq2seq"
    size = catalog.model_size(config.model.name)
    if config.model.name in DEMO_MODELS:
        return DEMO_MODELS[config.model.name] == "seq2seq"
    return size is not None and size.architecture == "seq2seq"


def vllm_engine(config: GpuflowConfig) -> Iterator[Finding]:
    if config.inference.engine != "vllm":
        return
    if not config.uses_gpu:
        yield error("inference.engine", "vLLM needs a GPU, and gpu.type none runs on CPU workers",
                    "set a gpu.type, or inference.engine: transformers")
    if _is_seq2seq(config):
        yield error("inference.engine", f"{config.model.name} is a seq2seq model; gpuflow serves only decoder-only "
                    "models with vLLM", "set inference.engine: transformers for seq2seq models")
    if config.recipe != "vllm":
        yield error("container.recipe", f"recipe {config.recipe} has no vLLM",
                    "leave container.recipe empty (it picks vllm) or set container.recipe: vllm")
    if config.gpu.sharing in ("mps", "model_copies"):
        yield error("gpu.sharing", f"gpu.sharing {config.gpu.sharing} shares gpuflow's own model copies; vLLM's "
                    "server is one per worker, shared by Beam across the SDK processes", "set gpu.sharing: auto")
    yield from _vllm_memory(config)


def _vllm_memory(config: GpuflowConfig) -> Iterator[Finding]:
    """vLLM takes gpu_memory_utilization of the GPU for the weights and its KV cache; both must fit in that share."""
    gpu = catalog.gpu_type(config.gpu.type)
    parameters_m = model_parameters_m(config)
    if gpu is None or parameters_m is None:
        return
    share = config.inference.vllm_gpu_memory_utilization
    weights_gb = parameters_m * 1e6 * catalog.bytes_per_parameter("bfloat16") / 1e9
    cache_gb = kv_cache_gb(config) or 0.0
    budget_gb = share * gpu.memory_gb * config.gpu.count
    if weights_gb + cache_gb > budget_gb:
        yield error("inference.vllm_gpu_memory_utilization",
                    f"vLLM would hold {weights_gb:.1f} GB of bf16 weights and {cache_gb:.1f} GB of KV cache in "
                    f"{share:.0%} of {config.gpu.count} x {gpu.name} ({budget_gb:.1f} GB)",
                    "use a GPU with more memory, raise inference.vllm_gpu_memory_utilization, or lower "
                    "inference.max_batch_size or model.max_input_tokens")


def vllm_runs_here(config: GpuflowConfig) -> Iterator[Finding]:
    """The local profile runs the pipeline on this machine: vLLM needs a GPU and the vllm package here."""
    import importlib.util
    import shutil

    if config.inference.engine != "vllm":
        return
    missing = [what for what, absent in (("a GPU (no nvidia-smi)", shutil.which("nvidia-smi") is None),
                                         ("the vllm package", importlib.util.find_spec("vllm") is None)) if absent]
    if missing:
        yield error("inference.engine", f"vLLM cannot run on this machine: it lacks {' and '.join(missing)}",
                    "run inference.engine: vllm on the gcp profile (the vllm recipe's image on GPU workers), or "
                    "use inference.engine: transformers here")
