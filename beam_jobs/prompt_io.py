"""Prompts in, answers and dead letters out: the parsing, validation and routing that the streaming and the batch
pipeline share (beam_jobs/llm_inference.py builds them into a job).

Every prompt ends in exactly one place: answered, or a dead letter with its reason (a word of
``DEAD_LETTER_REASONS``) and an error for a person. Batch input is read as bytes, so one bad byte becomes a dead
letter instead of failing the job.
"""

import base64
import json
from collections.abc import Iterable
from typing import Any

import apache_beam as beam
from apache_beam.ml.inference.base import PredictionResult

from llm_models import load_tokenizer, materialize_model_dir

#: The Pub/Sub message attribute that carries a prompt's id, copied onto its answer.
ID_ATTRIBUTE = "id"
#: The answer's attribute that names the model version that produced it.
MODEL_ATTRIBUTE = "model"

# A prompt element travelling to RunInference: (prompt id, prompt text, token ids).
PromptElement = tuple[str, str, list[int]]


class ValidatePrompt(beam.DoFn):
    """Decode, check and tokenize a prompt. Bad input goes to the ``dead_letter`` output with a reason."""

    DEAD_LETTER = "dead_letter"

    def __init__(self, model_name: str, max_input_tokens: int, chat_template: bool = False):
        self.model_name = model_name
        self.max_input_tokens = max_input_tokens
        self.chat_template = chat_template
        self._tokenizer = None

    def setup(self):
        self._tokenizer = load_tokenizer(materialize_model_dir(self.model_name))
        if self.chat_template and not self._tokenizer.chat_template:
            raise ValueError(f"--chat-template is set but the tokenizer of {self.model_name} has no chat template. "
                             "Fix: set model.chat_template: false, or use the model's instruction-tuned variant.")

    def _tokens(self, prompt: str) -> list[int]:
        """The prompt's token ids; with --chat-template, as the one user message of a chat, ready for the answer."""
        if self.chat_template:
            return list(self._tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True,
                return_dict=True)["input_ids"])
        return self._tokenizer(prompt)["input_ids"]

    def process(self, record: tuple[str, bytes | str]):
        prompt_id, payload = record
        try:
            prompt = payload.decode("utf-8") if isinstance(payload, bytes) else payload
        except UnicodeDecodeError as error:
            yield dead_letter(prompt_id, payload, f"invalid UTF-8: {error}", "invalid_utf8")
            return
        if not prompt.strip():
            yield dead_letter(prompt_id, payload, "empty prompt", "empty_prompt")
            return
        tokens = self._tokens(prompt)
        if len(tokens) > self.max_input_tokens:
            yield dead_letter(
                prompt_id, payload, f"prompt has {len(tokens)} tokens, over the limit of {self.max_input_tokens}",
                "too_many_tokens")
            return
        yield prompt_id, prompt, tokens


#: Each dead letter's ``reason``, a word for counting; its ``error`` says the same for a person, with details.
DEAD_LETTER_REASONS = ("invalid_utf8", "blank_line", "invalid_json", "not_an_object", "no_id", "no_prompt",
                       "prompt_not_a_string", "duplicate_id", "empty_prompt", "too_many_tokens", "inference_failed")


def dead_letter(prompt_id: str | None, payload: Any, error: str, reason: str) -> beam.pvalue.TaggedOutput:
    """A dead letter: the id, the prompt or input line as text, the reason (a word of ``DEAD_LETTER_REASONS``) and
    the error. Bytes that are no UTF-8 are kept exactly too, as ``line_base64``, since JSON text cannot carry them."""
    letter = {"id": prompt_id, "prompt": payload, "reason": reason, "error": error}
    if isinstance(payload, bytes):
        letter["prompt"] = payload.decode("utf-8", errors="replace")
        try:
            payload.decode("utf-8")
        except UnicodeDecodeError:
            letter["line_base64"] = base64.b64encode(payload).decode("ascii")
    return beam.pvalue.TaggedOutput(ValidatePrompt.DEAD_LETTER, letter)


def route_prediction(result: PredictionResult):
    """Answers to the main output (with the model version that gave them); per-prompt failures to the dead-letter
    output."""
    prompt_id, prompt, _ = result.example
    if isinstance(result.inference, dict):
        yield dead_letter(prompt_id, prompt, result.inference["error"], result.inference["reason"])
        return
    # GenerateHandler.run_inference; a rollout's evaluation adds the batch's key, round and index
    # (evaluate_interleaved.FixedBatchHandler), by which the gate pairs the two versions' batches.
    response, tokens, batch_size, seconds, *batch = result.inference
    answer = {"id": prompt_id, "prompt": prompt, "response": response, "model": result.model_id,
              "batch_size": batch_size, "response_tokens": tokens, "latency_s": seconds}
    if batch:
        answer.update(zip(("batch", "round", "batch_index"), batch, strict=True))
    yield answer


def failed_batch_to_dead_letters(failure) -> Iterable[dict[str, Any]]:
    """RunInference's failed_inferences: (batch or element, exception info) -> one dead letter each."""
    elements, error = failure
    if not isinstance(elements, list):
        elements = [elements]
    message = f"inference failed: {error}"
    for element in elements:
        prompt_id, prompt = (element[0], element[1]) if isinstance(element, tuple) else (None, element)
        yield {"id": prompt_id, "prompt": prompt, "reason": "inference_failed", "error": message}


def parse_jsonl_line(line: bytes | str):
    """One input line (read as bytes, so that one bad byte cannot fail the read) -> (id, prompt), or a dead letter
    with the reason and the original line."""
    if isinstance(line, bytes):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError as error:
            yield dead_letter(None, line, f"invalid UTF-8: {error}", "invalid_utf8")
            return
    if not line.strip():
        yield dead_letter(None, line, "malformed input line: blank", "blank_line")
        return
    try:
        record = json.loads(line)
    except ValueError as error:
        yield dead_letter(None, line, f"malformed input line: invalid JSON: {error}", "invalid_json")
        return
    if not isinstance(record, dict):
        yield dead_letter(None, line, "malformed input line: not a JSON object", "not_an_object")
        return
    prompt_id = str(record["id"]) if record.get("id") not in (None, "") else None
    if prompt_id is None:
        yield dead_letter(None, line, 'malformed input line: no "id"', "no_id")
    elif "prompt" not in record:
        yield dead_letter(prompt_id, line, 'malformed input line: no "prompt"', "no_prompt")
    elif not isinstance(record["prompt"], str):
        yield dead_letter(prompt_id, line, 'malformed input line: "prompt" is not a string',
                          "prompt_not_a_string")
    else:
        yield prompt_id, record["prompt"]


def first_of_each_id(grouped: tuple[str, Iterable[str]]):
    """Batch input: one answer per id. Of lines that share an id, the one whose prompt sorts first is kept (the
    same on every rerun); the others are dead letters."""
    prompt_id, prompts = grouped
    kept, *repeated = sorted(prompts)
    yield prompt_id, kept
    for prompt in repeated:
        yield dead_letter(prompt_id, prompt, f"duplicate id {prompt_id!r}: an earlier line of this input has it",
                          "duplicate_id")


def pubsub_to_record(message) -> tuple[str, bytes]:
    attributes = message.attributes or {}
    prompt_id = attributes.get(ID_ATTRIBUTE) or getattr(message, "message_id", None) or ""
    return prompt_id, message.data


def answer_to_pubsub(answer: dict[str, Any]):
    from apache_beam.io.gcp.pubsub import PubsubMessage

    attributes = {ID_ATTRIBUTE: answer["id"] or "", "batch_size": str(answer["batch_size"]),
                  MODEL_ATTRIBUTE: answer["model"]}
    return PubsubMessage(answer["response"].encode("utf-8"), attributes)


def dead_letter_to_pubsub(letter: dict[str, Any]):
    from apache_beam.io.gcp.pubsub import PubsubMessage

    attributes = {ID_ATTRIBUTE: letter.get("id") or "", "reason": letter["reason"], "error": letter["error"][:1024]}
    return PubsubMessage(json.dumps(letter).encode("utf-8"), attributes)


def route_completion(keyed, model: str = ""):
    """A vLLM completion (keyed by prompt id) -> an answer; an empty completion -> a dead letter."""
    prompt_id, result = keyed
    choices = getattr(result.inference, "choices", None) or []
    if not choices:
        yield dead_letter(prompt_id, result.example, "inference failed: vLLM returned no completion",
                          "inference_failed")
        return
    usage = getattr(result.inference, "usage", None)
    yield {"id": prompt_id, "prompt": result.example, "response": choices[0].text, "model": model,
           "batch_size": 1, "response_tokens": getattr(usage, "completion_tokens", None)}
