"""inference.engine: vllm, up to where this machine (no GPU, no vLLM) stops: the handler Beam gets, what the
pipeline makes of vLLM's completions, the export flag and the preflight rules. vLLM itself is NOT run here."""

import json
from types import SimpleNamespace

import pytest

import llm_handlers
import llm_inference
from gpuflow.configuration.loading import load_config
from gpuflow.preflight import run_preflight
from gpuflow.runs.naming import resource_names
from gpuflow.steps.launch import pipeline_argv

VLLM = ["model.name=meta-llama/Llama-3.1-8B", "inference.engine=vllm", "container.recipe=vllm"]


def gcp(*overrides):
    return load_config("configs/gcp.example.yaml", overrides=["project=my-real-project", *VLLM, *overrides])


def errors(config, field=None):
    return [f for f in run_preflight(config, check_environment=False)
            if f.level == "error" and (field is None or f.field == field)]


def test_a_decoder_only_model_on_an_l4_with_the_vllm_recipe_passes():
    assert errors(gcp("gpu.machine_type=g2-standard-8")) == []


@pytest.mark.parametrize(("overrides", "field", "words"), [
    (["gpu.type=none", "gpu.machine_type=n2-highmem-4", "require_gpu=false"], "inference.engine", "needs a GPU"),
    (["model.name=google/flan-t5-large"], "inference.engine", "seq2seq"),
    (["container.recipe=l4"], "container.recipe", "no vLLM"),
    (["inference.max_batch_size=256", "model.max_input_tokens=4096"], "inference.vllm_gpu_memory_utilization",
     "KV cache"),
    (["inference.vllm_gpu_memory_utilization=0.5"], "inference.vllm_gpu_memory_utilization", "bf16 weights"),
])
def test_what_vllm_cannot_serve_is_refused_with_its_fix(overrides, field, words):
    (found,) = errors(gcp("gpu.machine_type=g2-standard-8", *overrides), field)
    assert words in found.problem and found.fix


def test_on_this_machine_vllm_is_said_plainly_not_to_run():
    config = load_config(None, overrides=["model.name=gpuflow-demo-causal", "inference.engine=vllm",
                                          "container.recipe=vllm"])
    from gpuflow.preflight.engine_rules import vllm_runs_here

    (finding,) = list(vllm_runs_here(config))
    assert finding.level == "error" and "vLLM cannot run on this machine" in finding.problem


def test_the_launch_passes_the_engine_and_the_export_writes_the_save_pretrained_folder(monkeypatch):
    from tests.gcp_fakes import FakeGoogleCloud

    FakeGoogleCloud().install(monkeypatch)  # the export names its account: the project's number, from Google
    config = gcp()
    argv = pipeline_argv(config, resource_names(config, "gf-vllm0001"))
    assert argv[argv.index("--engine") + 1] == "vllm"
    assert argv[argv.index("--vllm-gpu-memory-utilization") + 1] == "0.9"
    from gpuflow.platform.gcp import GcpPlatform

    job = GcpPlatform(config).custom_job(resource_names(config, "gf-vllm0001"), "gs://b/s.py", "gs://b/export.lock")
    assert "--save-pretrained" in job.job_spec.worker_pool_specs[0].container_spec.args[0]


def test_beams_vllm_handler_is_built_keyed_and_serves_the_exported_folder():
    from apache_beam.ml.inference.base import KeyedModelHandler
    from apache_beam.ml.inference.vllm_inference import VLLMCompletionsModelHandler

    args, _ = llm_inference.parse_args([
        "--model-name", "gs://b/gpuflow/gf-1/model", "--state-dict-path", "gs://b/gpuflow/gf-1/model/state_dict.pth",
        "--model-label", "meta-llama/Llama-3.1-8B", "--engine", "vllm", "--max-input-tokens", "512",
        "--max-new-tokens", "64", "--max-batch-size", "8", "--input", "in.jsonl", "--output", "out/"])
    keyed = llm_handlers.make_vllm_handler(args)
    assert isinstance(keyed, KeyedModelHandler)
    inner = keyed._unkeyed
    assert isinstance(inner, VLLMCompletionsModelHandler)
    assert inner._model_name == "meta-llama/Llama-3.1-8B"  # the name answers carry and requests ask for
    assert inner._vllm_server_kwargs == {"gpu-memory-utilization": "0.9", "max-model-len": "576"}
    assert llm_handlers.vllm_inference_args(args) == {"max_tokens": 64, "temperature": 0.0}


class FakeCompletions:
    """Stands in for vLLM's server (no GPU here): a keyed handler answering as the OpenAI completions API does."""

    def __init__(self):
        from apache_beam.ml.inference.base import KeyedModelHandler, ModelHandler, PredictionResult

        class Unkeyed(ModelHandler):
            def load_model(self):
                return None

            def run_inference(self, batch, model, inference_args=None):
                assert inference_args == {"max_tokens": 8, "temperature": 0.0}
                return [PredictionResult(prompt, SimpleNamespace(
                    choices=[] if "silence" in prompt else [SimpleNamespace(text=f"re: {prompt}")],
                    usage=SimpleNamespace(completion_tokens=3))) for prompt in batch]

            def validate_inference_args(self, inference_args):
                pass

        self.handler = KeyedModelHandler(Unkeyed())


def test_completions_become_answers_and_an_empty_one_a_dead_letter(tmp_path, exported_causal_model):
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"id": i, "prompt": p}) + "\n" for i, p in
                                               (("a", "the river"), ("b", "silence please"))))
    argv = ["--model-name", str(exported_causal_model.parent), "--state-dict-path", str(exported_causal_model),
            "--engine", "vllm", "--max-new-tokens", "8", "--model-label", "demo",
            "--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out") + "/"]
    pipeline = beam.Pipeline(options=PipelineOptions(["--runner", "BundleBasedDirectRunner"]))
    llm_inference.run(argv, save_main_session=False, test_pipeline=pipeline, model_handler=FakeCompletions().handler)
    pipeline.run().wait_until_finish()
    answers = [json.loads(line) for line in (tmp_path / "out" / "responses.jsonl").read_text().splitlines()]
    letters = [json.loads(line) for line in (tmp_path / "out" / "dead_letters.jsonl").read_text().splitlines()]
    assert [(a["id"], a["response"], a["model"], a["response_tokens"]) for a in answers] == [
        ("a", "re: the river", "demo", 3)]
    assert [(d["id"], d["reason"]) for d in letters] == [("b", "inference_failed")]
