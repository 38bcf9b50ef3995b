"""Decoder-only models in the catalog and preflight: sizes, the KV cache in the memory rule, the demo model."""

import pytest

from gpuflow import catalog
from gpuflow.configuration.loading import load_config
from gpuflow.dataflow.gpu_options import kv_cache_gb, model_memory_gb
from gpuflow.preflight import run_preflight


def config(model: str, *overrides):
    return load_config("configs/gcp.example.yaml", overrides=["project=my-real-project", f"model.name={model}",
                                                              *overrides])


def test_the_kv_cache_of_a_whole_batch_is_counted_on_top_of_the_weights():
    llama = config("meta-llama/Llama-3.1-8B", "inference.max_batch_size=16", "model.max_input_tokens=512",
                   "model.max_new_tokens=64")
    # keys and values x 32 layers x 8 KV heads x 128 dims x 2 bytes (bf16), for 16 x (512 + 64) tokens
    assert kv_cache_gb(llama) == pytest.approx(2 * 32 * 8 * 128 * 2 * 16 * 576 / 1e9)
    weights_gb = 8030 * 1e6 * 2 * catalog.runtime_overhead() / 1e9
    assert model_memory_gb(llama) == pytest.approx(weights_gb + kv_cache_gb(llama))
    doubled = config("meta-llama/Llama-3.1-8B", "inference.max_batch_size=32", "model.max_input_tokens=512",
                     "model.max_new_tokens=64")
    assert kv_cache_gb(doubled) == pytest.approx(2 * kv_cache_gb(llama))
    assert kv_cache_gb(config("google/flan-t5-large")) is None  # seq2seq: the overhead covers short answers


def test_a_batch_whose_kv_cache_outgrows_the_gpu_is_refused_with_the_numbers():
    fits = config("google/gemma-7b", "gpu.type=nvidia-l4", "gpu.machine_type=g2-standard-8",
                  "inference.max_batch_size=8", "model.max_input_tokens=512", "model.max_new_tokens=64")
    too_big = config("google/gemma-7b", "gpu.type=nvidia-l4", "gpu.machine_type=g2-standard-8",
                     "inference.max_batch_size=64", "model.max_input_tokens=2048", "model.max_new_tokens=256")

    def errors(cfg):
        return [f for f in run_preflight(cfg, check_environment=False) if f.level == "error" and f.field == "gpu.type"]

    assert errors(fits) == []
    (error,) = errors(too_big)
    assert "does not fit" in error.problem
    assert any(f.field == "inference.max_batch_size" and "KV cache" in f.problem
               for f in run_preflight(too_big, check_environment=False))


def test_a_causal_model_without_a_kv_shape_is_said_to_be_uncounted():
    findings = run_preflight(config("google/gemma-2-9b"), check_environment=False)
    assert any(f.level == "warning" and "not counted" in f.problem for f in findings)


def test_the_export_machine_is_sized_from_the_parameter_count():
    assert catalog.model_size("google/gemma-2b").export_machine == "e2-standard-4"
    assert catalog.model_size("meta-llama/Llama-3.1-8B").export_machine == "e2-highmem-4"
    # a decoder-only model the table lacks, and a seq2seq one (guide 002's rows)
    assert catalog.export_size_for(7000, "causal").export_machine == "e2-highmem-4"
    assert catalog.export_size_for(7000).export_machine == "e2-highmem-16"


def test_the_demo_causal_model_is_llama_shaped_and_its_tokenizer_pads_on_the_left(tmp_path):
    from transformers import AutoConfig, AutoTokenizer

    from gpuflow.platform.demo_model import write_demo_model

    directory = write_demo_model(tmp_path, architecture="causal")
    assert AutoConfig.from_pretrained(directory).model_type == "llama"
    assert not AutoConfig.from_pretrained(directory).is_encoder_decoder
    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert tokenizer.padding_side == "left" and tokenizer.eos_token_id not in tokenizer("a river")["input_ids"]
