"""The inference pipeline in batch mode on Beam's (bundle-based) DirectRunner, with a real T5."""

import base64
import json

import pytest

import llm_handlers
import llm_inference
import llm_models
import prompt_io
from tests.helpers import mixed_length_prompts

MAX_NEW_TOKENS = 8


def read_jsonl(path):
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def run_batch(tmp_path, exported_model, lines, model_handler=None, extra=()):
    input_path = tmp_path / "prompts.jsonl"
    input_path.write_bytes(b"\n".join(line if isinstance(line, bytes) else line.encode() for line in lines) + b"\n")
    argv = [
        "--model-name", str(exported_model.parent), "--state-dict-path", str(exported_model),
        "--max-new-tokens", str(MAX_NEW_TOKENS), "--max-batch-size", "8",
        "--input", str(input_path), "--output", str(tmp_path / "out") + "/",
        "--runner", "BundleBasedDirectRunner", *extra,
    ]
    (tmp_path / "out").mkdir(exist_ok=True)
    if model_handler is None:
        llm_inference.run(argv, save_main_session=False)
    else:
        import apache_beam as beam
        from apache_beam.options.pipeline_options import PipelineOptions

        pipeline = beam.Pipeline(options=PipelineOptions(["--runner", "BundleBasedDirectRunner"]))
        llm_inference.run(argv, save_main_session=False, test_pipeline=pipeline, model_handler=model_handler)
        pipeline.run().wait_until_finish()
    return read_jsonl(tmp_path / "out" / "responses.jsonl"), read_jsonl(tmp_path / "out" / "dead_letters.jsonl")


def summary(tmp_path):
    return json.loads((tmp_path / "out" / "summary.json").read_text())


def test_mixed_lengths_in_shared_batches_equal_generate_alone(tmp_path, exported_model, reference_generate):
    prompts = mixed_length_prompts(reference_generate.tokenizer, 40)
    lines = [json.dumps({"id": f"p{i}", "prompt": prompt}) for i, prompt in enumerate(prompts)]
    answers, dead_letters = run_batch(tmp_path, exported_model, lines)
    assert dead_letters == []
    assert sorted(a["id"] for a in answers) == sorted(f"p{i}" for i in range(len(prompts)))
    assert max(a["batch_size"] for a in answers) > 1, "prompts of different lengths never shared a batch"
    for answer in answers:
        prompt = prompts[int(answer["id"][1:])]
        assert answer["prompt"] == prompt
        assert answer["response"] == reference_generate(prompt, MAX_NEW_TOKENS), answer["id"]
        assert answer["response"].strip()


def test_a_causal_model_answers_200_mixed_length_prompts_each_as_generate_alone(
        tmp_path, exported_causal_model, reference_generate_causal):
    """Decoder-only: left padding in shared batches, and the answer is the new tokens alone."""
    prompts = mixed_length_prompts(reference_generate_causal.tokenizer, 200)
    lines = [json.dumps({"id": f"p{i}", "prompt": prompt}) for i, prompt in enumerate(prompts)]
    answers, dead_letters = run_batch(tmp_path, exported_causal_model, lines)
    assert dead_letters == [] and len(answers) == len(prompts)
    assert max(a["batch_size"] for a in answers) > 1, "prompts of different lengths never shared a batch"
    mismatched = [a["id"] for a in answers
                  if a["response"] != reference_generate_causal(prompts[int(a["id"][1:])], MAX_NEW_TOKENS)]
    assert mismatched == []
    assert {a["response_tokens"] for a in answers} == {MAX_NEW_TOKENS}  # the new tokens alone: no echoed prompt


def test_every_input_line_ends_answered_or_dead_lettered_with_its_reason(tmp_path, exported_model):
    """One bad byte, or any other malformed line, never fails the batch: each line lands in exactly one place."""
    too_long = " ".join(["river"] * 600)
    invalid_utf8 = b'{"id": "latin1", "prompt": "caf\xe9"}'
    lines = [
        json.dumps({"id": "good", "prompt": "what is the capital of france"}),
        "this is not json",
        json.dumps({"id": "no-prompt"}),
        json.dumps({"prompt": "who am i"}),
        json.dumps({"id": "not-text", "prompt": 42}),
        json.dumps({"id": "empty", "prompt": "   "}),
        json.dumps({"id": "long", "prompt": too_long}),
        invalid_utf8,
        "",
        json.dumps({"id": "twice", "prompt": "a river"}),
        json.dumps({"id": "twice", "prompt": "b river"}),
        json.dumps(["a", "list"]),
    ]
    answers, dead_letters = run_batch(tmp_path, exported_model, lines)
    assert sorted((a["id"], a["prompt"]) for a in answers) == [("good", "what is the capital of france"),
                                                              ("twice", "a river")]
    assert len(answers) + len(dead_letters) == len(lines)  # every line in exactly one place
    reasons = {letter["id"]: letter["error"] for letter in dead_letters if letter["id"]}
    assert reasons == {
        "no-prompt": 'malformed input line: no "prompt"',
        "not-text": 'malformed input line: "prompt" is not a string',
        "empty": "empty prompt",
        "long": reasons["long"],
        "twice": "duplicate id 'twice': an earlier line of this input has it",
    }
    assert "over the limit of 512" in reasons["long"]
    anonymous = sorted(letter["error"].split(":")[0] + ":" + letter["error"].split(":")[1]
                       for letter in dead_letters if letter["id"] is None)
    assert anonymous == ["invalid UTF-8: 'utf-8' codec can't decode byte 0xe9 in position 31",
                         "malformed input line: blank", "malformed input line: invalid JSON",
                         "malformed input line: no \"id\"", "malformed input line: not a JSON object"]
    (bad_bytes,) = [letter for letter in dead_letters if letter["error"].startswith("invalid UTF-8")]
    assert base64.b64decode(bad_bytes["line_base64"]) == invalid_utf8  # the original line, byte for byte
    assert summary(tmp_path) == {
        "lines_in": len(lines), "answered": 2, "dead_lettered": len(lines) - 2,
        "response_tokens": sum(answer["response_tokens"] for answer in answers),
        "dead_letter_reasons": {"blank_line": 1, "duplicate_id": 1, "empty_prompt": 1, "invalid_json": 1,
                                "invalid_utf8": 1, "no_id": 1, "no_prompt": 1, "not_an_object": 1,
                                "prompt_not_a_string": 1, "too_many_tokens": 1}}
    assert all(0 < answer["response_tokens"] <= MAX_NEW_TOKENS for answer in answers)
    assert {answer["model"] for answer in answers} == {str(exported_model.parent)}  # --model-name, no label given


class FailOnBoom(llm_handlers.GenerateHandler):
    """The real handler, made to fail on one prompt, as a CUDA OOM on one long prompt would."""

    def _generate(self, loaded, token_lists):
        if any(tokens == self.boom_tokens for tokens in token_lists):
            raise RuntimeError("CUDA out of memory (simulated)")
        return super()._generate(loaded, token_lists)


def test_a_failed_inference_goes_to_dead_letters_and_its_batch_mates_are_answered(
    tmp_path, exported_model, reference_generate
):
    handler = FailOnBoom(str(exported_model.parent), str(exported_model), max_new_tokens=MAX_NEW_TOKENS,
                         max_batch_size=8)
    handler.boom_tokens = reference_generate.tokenizer("boom")["input_ids"]
    prompts = {f"p{i}": f"tell me about the river {i}" for i in range(10)} | {"bad": "boom"}
    lines = [json.dumps({"id": key, "prompt": prompt}) for key, prompt in prompts.items()]
    answers, dead_letters = run_batch(tmp_path, exported_model, lines, model_handler=handler)
    assert [(d["id"], d["error"]) for d in dead_letters] == [
        ("bad", "inference failed: RuntimeError: CUDA out of memory (simulated)")
    ]
    assert sorted(a["id"] for a in answers) == sorted(k for k in prompts if k != "bad")
    for answer in answers:
        assert answer["response"] == reference_generate(prompts[answer["id"]], MAX_NEW_TOKENS)


def test_require_gpu_fails_the_pipeline_instead_of_running_on_cpu(tmp_path, exported_model):
    lines = [json.dumps({"id": "a", "prompt": "hello river"})]
    with pytest.raises(Exception, match="require_gpu is set but PyTorch sees no CUDA device"):
        run_batch(tmp_path, exported_model, lines, extra=["--require-gpu"])


def test_model_is_built_in_the_inference_dtype_without_random_init(exported_model):
    import torch

    model = llm_models.load_model(str(exported_model.parent), str(exported_model), "cpu", torch.float32, "seq2seq")
    saved = torch.load(exported_model, weights_only=True)
    assert {t.dtype for t in saved.values()} == {torch.bfloat16}
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    for name, tensor in model.state_dict().items():
        if name in saved:
            assert torch.equal(tensor, saved[name].float()), name
    assert model.lm_head.weight.data_ptr() == model.shared.weight.data_ptr()  # tied, not a second copy


def test_model_copies_shared_across_processes_answer_as_generate_alone(tmp_path, exported_model, reference_generate):
    """gpu.sharing: model_copies: Beam's multi-process sharing serves the model; answers do not change."""
    prompts = {f"p{i}": f"the green mountain by the river {i}" for i in range(6)}
    lines = [json.dumps({"id": key, "prompt": prompt}) for key, prompt in prompts.items()]
    answers, dead_letters = run_batch(tmp_path, exported_model, lines, extra=("--model-copies", "2"))
    assert dead_letters == []
    assert {a["id"]: a["response"] for a in answers} == {
        key: reference_generate(prompt, MAX_NEW_TOKENS) for key, prompt in prompts.items()}


def test_a_causal_export_writes_the_save_pretrained_folder_vllm_serves(tmp_path, demo_causal_model_dir):
    import subprocess
    import sys

    from transformers import AutoModelForCausalLM

    from tests.helpers import ROOT

    target = tmp_path / "export" / "state_dict.pth"
    subprocess.run([sys.executable, str(ROOT / "beam_jobs" / "download_model.py"), "local", "--model-name",
                    str(demo_causal_model_dir), "--state-dict-path", str(target), "--save-pretrained"],
                   check=True, capture_output=True)
    folder = tmp_path / "export" / "hf"
    assert (folder / "model.safetensors").exists() and (folder / "tokenizer.json").exists()
    marker = json.loads((tmp_path / "export" / "gpuflow_export.json").read_text())
    assert (marker["architecture"], marker["save_pretrained"]) == ("causal", True)
    reloaded = AutoModelForCausalLM.from_pretrained(folder)  # what vLLM loads: the weights, in bf16
    assert next(reloaded.parameters()).dtype.is_floating_point and reloaded.config.model_type == "llama"


def test_a_chat_template_formats_each_prompt_as_one_user_message(tmp_path, demo_causal_model_dir):
    import shutil

    from transformers import AutoTokenizer

    model_dir = tmp_path / "chat"
    shutil.copytree(demo_causal_model_dir, model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.chat_template = ("{% for m in messages %}user: {{ m['content'] }}{% endfor %}"
                               "{% if add_generation_prompt %} answer:{% endif %}")
    tokenizer.save_pretrained(model_dir)
    chatty = prompt_io.ValidatePrompt(str(model_dir), 512, chat_template=True)
    chatty.setup()
    plain = prompt_io.ValidatePrompt(str(model_dir), 512)
    plain.setup()
    (_, _, tokens), = chatty.process(("p1", "the river"))
    assert tokens == tokenizer("user: the river answer:")["input_ids"] != next(plain.process(("p1", "the river")))[2]
    without = prompt_io.ValidatePrompt(str(demo_causal_model_dir), 512, chat_template=True)
    with pytest.raises(ValueError, match="no chat template. Fix"):
        without.setup()
