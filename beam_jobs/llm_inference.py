"""LLM inference with Beam RunInference: Pub/Sub in, Pub/Sub out (streaming), or JSONL (batch).

It needs no gpuflow package: Dataflow workers run it with beam_jobs/llm_models.py (model loading and batched
generation, without Beam) beside it, on the images' PYTHONPATH.

Streaming::

    python beam_jobs/llm_inference.py --model-name DIR_OR_HUB_NAME --state-dict-path gs://.../state_dict.pth \
        --messages-subscription projects/P/subscriptions/S --responses-topic projects/P/topics/T \
        --dead-letter-topic projects/P/topics/D [Beam pipeline options]

Batch (a line in is {"id": ..., "prompt": ...}; an answer line adds "response" and "model")::

    python beam_jobs/llm_inference.py --model-name ... --state-dict-path ... --input "prompts/*.jsonl" --output out/ \
        [--dead-letter-output dead/]

A batch job also writes summary.json beside its answers: lines in, answered, dead-lettered (by reason), tokens
generated.

Every prompt ends in exactly one place: answered, or in the dead-letter output with its reason. Batch input is
read as bytes, so a line that is no UTF-8 (or no JSON object with an id and a string prompt, or a repeated id)
becomes a dead letter instead of failing the job.
"""

import argparse
import base64
import json
import logging
import os
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

import apache_beam as beam
from apache_beam.ml.inference.base import ModelHandler, PredictionResult, RunInference
from apache_beam.options.pipeline_options import PipelineOptions, SetupOptions, StandardOptions
from llm_models import (
    ARCHITECTURES,
    LoadedModel,
    ModelVersion,
    choose_device_and_dtype,
    list_files,
    load_model,
    load_tokenizer,
    materialize_model_dir,
    model_architecture,
)

from download_model import SAVE_PRETRAINED_DIR  # where the export's save_pretrained folder lies

log = logging.getLogger("gpuflow.llm_inference")

#: The Pub/Sub message attribute that carries a prompt's id, copied onto its answer.
ID_ATTRIBUTE = "id"
#: The answer's attribute that names the model version that produced it.
MODEL_ATTRIBUTE = "model"

# A prompt element travelling to RunInference: (prompt id, prompt text, token ids).
PromptElement = tuple[str, str, list[int]]
#: Token-length bucket boundaries for --group-by-length.
LENGTH_BUCKETS = [16, 32, 64, 128, 256, 512]


def prompt_token_length(element: PromptElement) -> int:
    return len(element[2])


# ------------------------------------------------------------------------------------------
# Model handler

_REFRESH_LOCK = threading.Lock()


def pointer_written_at(uri: str) -> float:
    """A pointer file's name starts with when it was written (epoch seconds, zero-padded so names sort by time;
    gpuflow.deployment writes them)."""
    try:
        return float(uri.rsplit("/", 1)[-1].split("-", 1)[0])
    except ValueError:
        return 0.0



class GenerateHandler(ModelHandler[PromptElement, PredictionResult, LoadedModel]):
    """Pads each batch with an attention mask and calls ``generate`` once per batch, for a seq2seq or a causal
    (decoder-only) model (``architecture``: auto reads the model's config).

    The guide's ``PytorchModelHandlerTensor`` stacks token tensors and fails as soon as two
    prompts of different lengths share a batch. A prompt whose inference fails gets an
    ``{"error": ...}`` inference instead of sinking the other prompts of its batch.
    """

    def __init__(
        self,
        model_name: str,
        state_dict_path: str,
        max_new_tokens: int = 16,
        dtype: str = "auto",
        require_gpu: bool = False,
        min_batch_size: int = 1,
        max_batch_size: int = 16,
        max_batch_duration_secs: float | None = None,
        group_by_length: bool = False,
        model_copies: int | None = None,
        architecture: str = "auto",
        model_version: str = "",
        refresh_folder: str | None = None,
        refresh_poll_s: float = 0,
    ):
        batching: dict[str, Any] = {"min_batch_size": min_batch_size, "max_batch_size": max_batch_size}
        if group_by_length:
            # Beam's length-aware batching keys prompts by token-length bucket, so a batch pads little.
            # It runs on the stateful batching path, which needs a buffering duration.
            max_batch_duration_secs = max_batch_duration_secs or 1.0
            batching["length_fn"] = prompt_token_length
            batching["bucket_boundaries"] = LENGTH_BUCKETS
        if max_batch_duration_secs:
            batching["max_batch_duration_secs"] = max_batch_duration_secs
        super().__init__(min_batch_size=min_batch_size, max_batch_size=max_batch_size)
        self._batching = batching
        self.model_name = model_name
        self.state_dict_path = state_dict_path
        self.max_new_tokens = max_new_tokens
        self.dtype = dtype
        self.require_gpu = require_gpu
        self.architecture = architecture
        # The version the job starts with; a deployment's rollout may switch it (update_model_path, or polling).
        self.launch_version = ModelVersion(model_version or model_name, state_dict_path)
        self._requested: str | None = None  # the pointer Beam's model refresh handed over last
        self._serving: ModelVersion | None = None  # the version that loaded last, the fallback of a bad one
        self.refresh_folder, self.refresh_poll_s = refresh_folder, refresh_poll_s
        self._launched_at = time.time()  # pointers written before the job started are not rollouts for it
        self._next_poll, self._tried_pointers = 0.0, set()
        if model_copies:
            # Beam loads this many copies per worker and shares them across its SDK processes.
            self._share_across_processes, self._model_copies = True, model_copies

    def batch_elements_kwargs(self) -> dict[str, Any]:
        return dict(self._batching)

    def update_model_path(self, model_path: str | None = None) -> None:
        """Beam's automatic model refresh: the newest pointer file the WatchFilePattern side input saw (``''``
        before any was written after the job started: keep the launch version)."""
        if model_path:
            self._requested = model_path

    def load_model(self) -> LoadedModel:
        """The requested version; if it cannot load, the version served before it (the job keeps answering,
        with the old version's id, and the rollout's smoke test sees that the new one never took over)."""
        wanted = ModelVersion.from_pointer(self._requested) if self._requested else self.launch_version
        try:
            loaded = self._load_version(wanted)
        except Exception as error:
            if self._serving is None or self._serving.version == wanted.version:
                raise
            log.error("gpuflow: model version %s failed to load (%s: %s); keeping version %s", wanted.version,
                      type(error).__name__, error, self._serving.version)
            return self._load_version(self._serving)
        self._serving = wanted
        return loaded

    def _load_version(self, version: ModelVersion) -> LoadedModel:
        """A version's weights into the job's own model (its config and tokenizer, as launched): a new version
        is new weights for the same model, so weights of another shape fail here, and the job keeps its version."""
        started = time.monotonic()
        device, dtype = choose_device_and_dtype(self.dtype, self.require_gpu)
        model_dir = materialize_model_dir(self.model_name)
        architecture = model_architecture(model_dir, self.architecture)
        model = load_model(model_dir, version.state_dict_path, device, dtype, architecture)
        log.info(
            "gpuflow: model loaded (%s) on %s in %s from %s in %.1fs, version %s", architecture, device, dtype,
            version.state_dict_path, time.monotonic() - started, version.version,
        )
        return LoadedModel(model, load_tokenizer(model_dir), device, architecture, version)

    def _polled(self, loaded: LoadedModel) -> None:
        """``refresh_poll_s``: the local profile's stand-in for the side input (Beam's legacy DirectRunner can run
        neither WatchFilePattern's splittable DoFn nor a global-window side input in streaming). Every
        ``refresh_poll_s`` it reads the same pointer folder, and switches the shared model in place when a pointer
        newer than the job appeared: the same ``update_model_path`` and ``load_model`` as on Dataflow."""
        if not self.refresh_poll_s or time.monotonic() < self._next_poll or not isinstance(loaded, LoadedModel):
            return  # (a model shared across processes is a proxy: Beam's side input reloads it, polling cannot)
        self._next_poll = time.monotonic() + self.refresh_poll_s
        with _REFRESH_LOCK:
            newest = next(reversed([p for p in list_files(self.refresh_folder, ".json")
                                    if pointer_written_at(p) > self._launched_at]), None)
            if newest is None or newest in self._tried_pointers or newest == loaded.pointer:
                return
            self._tried_pointers.add(newest)
            self._serving = loaded.source  # this DoFn's handler may not be the one that loaded the shared model
            self.update_model_path(newest)
            replacement = self.load_model()
            replacement.pointer = newest
            loaded.__dict__.update(replacement.__dict__)  # the shared model object, switched for every thread

    def _generate(self, loaded: LoadedModel, token_lists: Sequence[list[int]]) -> list[tuple[str, int]]:
        return loaded.generate_counted(token_lists, self.max_new_tokens)

    def run_inference(
        self, batch: Sequence[PromptElement], model: LoadedModel, inference_args: dict[str, Any] | None = None
    ) -> Iterable[PredictionResult]:
        self._polled(model)
        try:
            answers: list[Any] = self._generate(model, [tokens for _, _, tokens in batch])
        except Exception as batch_error:  # retry one by one so one bad prompt cannot sink its batch
            if len(batch) == 1:
                answers = [{"error": f"inference failed: {type(batch_error).__name__}: {batch_error}",
                            "reason": "inference_failed"}]
            else:
                log.warning("gpuflow: batch of %d failed (%s); retrying prompts one by one", len(batch), batch_error)
                alone = [next(iter(self.run_inference([element], model))).inference for element in batch]
                answers = [one if isinstance(one, dict) else one[:2] for one in alone]  # (text, tokens)
        # model_id: the model version that answered (each answer carries it); the inference: (text, tokens
        # generated, batch size), or an error.
        return [PredictionResult(element, answer if isinstance(answer, dict) else (*answer, len(batch)),
                                 model_id=model.version_id())
                for element, answer in zip(batch, answers, strict=True)]

    def get_metrics_namespace(self) -> str:
        return "gpuflow_llm"


def make_vllm_handler(args: argparse.Namespace):
    """Beam's ``VLLMCompletionsModelHandler`` (vLLM's OpenAI-compatible server on the worker), keyed by prompt id.

    Gap filled: Beam's handler starts the server on its ``model_name``, a hub name or a local folder, while
    gpuflow's model lies in Cloud Storage. So ``load_model`` first copies the export's save_pretrained folder to
    the worker's disk, and the server serves it under the model's own name (vLLM's --served-model-name). vLLM is
    imported only on the workers (the vllm recipe has it); building the pipeline needs Beam's module alone."""
    from apache_beam.ml.inference.base import KeyedModelHandler
    from apache_beam.ml.inference.vllm_inference import VLLMCompletionsModelHandler, _VLLMModelServer

    served_name = args.model_label or args.model_name
    folder = args.model_name.rstrip("/") + "/" + SAVE_PRETRAINED_DIR

    class ExportedModelVLLMHandler(VLLMCompletionsModelHandler):
        def load_model(self):
            local = materialize_model_dir(folder, with_weights=True)
            log.info("gpuflow: serving %s (copied from %s) with vLLM", served_name, folder)
            return _VLLMModelServer(local, {**self._vllm_server_kwargs, "served-model-name": served_name})

    handler = ExportedModelVLLMHandler(
        served_name,
        vllm_server_kwargs={"gpu-memory-utilization": str(args.vllm_gpu_memory_utilization),
                            "max-model-len": str(args.max_input_tokens + args.max_new_tokens)},
        min_batch_size=args.min_batch_size, max_batch_size=args.max_batch_size)
    return KeyedModelHandler(handler)


def vllm_inference_args(args: argparse.Namespace) -> dict[str, Any]:
    """Greedy, at most --max-new-tokens: what each completion request asks the vLLM server for."""
    return {"max_tokens": args.max_new_tokens, "temperature": 0.0}


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


# ------------------------------------------------------------------------------------------
# Parsing and routing


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
    response, tokens, batch_size = result.inference  # GenerateHandler.run_inference
    yield {"id": prompt_id, "prompt": prompt, "response": response, "model": result.model_id,
           "batch_size": batch_size, "response_tokens": tokens}


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


# ------------------------------------------------------------------------------------------
# Pipeline


def flag(value: str | bool = True) -> bool:
    """A boolean flag given bare (``--require-gpu``) or with a value, as a Flex Template launcher passes it."""
    if isinstance(value, bool):
        return value
    if value.lower() in ("true", "1", "yes"):
        return True
    if value.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, not {value!r}")


def build_arg_parser() -> argparse.ArgumentParser:
    """Every option also has its underscore spelling, the one a Flex Template launcher passes."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)

    def option(name: str, **kwargs) -> None:
        parser.add_argument(f"--{name}", f"--{name.replace('-', '_')}", dest=name.replace("-", "_"), **kwargs)

    option("model-name", required=True)
    option("state-dict-path", required=True)
    option("max-new-tokens", type=int, default=16)
    option("max-input-tokens", type=int, default=512)
    option("dtype", choices=("auto", "bfloat16", "float32"), default="auto")
    option("require-gpu", type=flag, nargs="?", const=True, default=False, help="fail when no GPU is visible")
    option("min-batch-size", type=int, default=1)
    option("max-batch-size", type=int, default=16)
    option("max-batch-duration-secs", type=float, default=0)
    option("model-copies", type=int, default=None,
           help="model copies per worker, shared across the SDK processes (gpu.sharing: model_copies)")
    option("accelerator-hint", default=None,
           help="Beam's accelerator resource hint for the RunInference step alone (right fitting)")
    option("group-by-length", type=flag, nargs="?", const=True, default=False,
           help="batch prompts of similar token length together (less padding)")
    option("model-label", default=None, help="the model's name (default: --model-name)")
    option("model-version", default=None,
           help="the version id each answer carries (default: the label); a deployment's versions are its own")
    option("model-refresh-folder", default=None,
           help="streaming: the folder of version pointers to watch; a new one switches the model without a restart")
    option("model-refresh", choices=("side_input", "poll"), default="side_input",
           help="side_input: RunInference's model_metadata_pcoll from WatchFilePattern (Dataflow); poll: the handler "
                "reads the folder itself (the local DirectRunner, which cannot run that side input)")
    option("model-refresh-interval-s", type=float, default=60, help="how often the pointer folder is read")
    option("architecture", choices=ARCHITECTURES, default="auto",
           help="seq2seq or causal (decoder-only); auto reads the model's config")
    option("engine", choices=("transformers", "vllm"), default="transformers",
           help="transformers: batched generate in this process; vllm: Beam's vLLM handler (a GPU, the vllm image)")
    option("vllm-gpu-memory-utilization", type=float, default=0.9,
           help="vllm: the share of the GPU's memory vLLM takes (weights and KV cache)")
    option("chat-template", type=flag, nargs="?", const=True, default=False,
           help="format each prompt with the tokenizer's chat template (instruction-tuned causal models)")
    batch = parser.add_argument_group("batch mode")
    batch.add_argument("--input", help="JSONL prompts file or glob")
    batch.add_argument("--output", help="directory (ending in /) or prefix for the JSONL outputs")
    batch.add_argument("--dead-letter-output", "--dead_letter_output", dest="dead_letter_output",
                       help="directory (ending in /) for dead_letters.jsonl (default: beside the answers)")
    streaming = parser.add_argument_group("streaming mode")
    for name in ("messages-subscription", "responses-topic", "dead-letter-topic"):
        streaming.add_argument(f"--{name}", f"--{name.replace('-', '_')}", dest=name.replace("-", "_"))
    return parser


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = build_arg_parser()
    known, pipeline_args = parser.parse_known_args(argv)
    streaming_args = [known.messages_subscription, known.responses_topic, known.dead_letter_topic]
    if known.input or known.output or known.dead_letter_output:
        if not (known.input and known.output) or any(streaming_args):
            parser.error("batch mode takes --input and --output, and no streaming arguments")
    elif not all(streaming_args):
        parser.error(
            "give --input and --output (batch), or --messages-subscription, --responses-topic and "
            "--dead-letter-topic (streaming)"
        )
    return known, pipeline_args


#: The files of a batch job in an --output directory (the dead letters also in --dead-letter-output's).
ANSWERS_FILE, DEAD_LETTERS_FILE, SUMMARY_FILE = "responses.jsonl", "dead_letters.jsonl", "summary.json"


def output_paths(output: str, dead_letter_output: str | None = None) -> tuple[str, str, str]:
    """The answers file, the dead-letter file and the summary file for ``--output`` (and ``--dead-letter-output``)."""
    if output.endswith("/") or os.path.isdir(output):
        base = output.rstrip("/") + "/"
        paths = [base + ANSWERS_FILE, base + DEAD_LETTERS_FILE, base + SUMMARY_FILE]
    else:
        paths = [f"{output}-{ANSWERS_FILE}", f"{output}-{DEAD_LETTERS_FILE}", f"{output}-{SUMMARY_FILE}"]
    if dead_letter_output:
        paths[1] = dead_letter_output.rstrip("/") + "/" + DEAD_LETTERS_FILE
    return paths[0], paths[1], paths[2]


def make_summary(_, lines_in: int, answered: int, dead_lettered: int, response_tokens: int,
                 reasons: dict[str, int]) -> dict[str, Any]:
    """The batch job's own counts: every line read ends answered or dead-lettered, so they add up."""
    return {"lines_in": lines_in, "answered": answered, "dead_lettered": dead_lettered,
            "response_tokens": response_tokens, "dead_letter_reasons": dict(sorted(reasons.items()))}


def write_summary(pipeline: beam.Pipeline, lines, answers, dead_letters, path: str) -> None:
    """One JSON file of counts, computed in the job from the very collections it reads and writes."""
    from apache_beam.pvalue import AsDict, AsSingleton

    def count(label: str, collection):
        return collection | f"Count{label}" >> beam.combiners.Count.Globally()

    tokens = (answers | "ResponseTokens" >> beam.Map(lambda answer: answer.get("response_tokens") or 0)
              | "SumTokens" >> beam.CombineGlobally(sum))
    reasons = (dead_letters | "Reasons" >> beam.Map(lambda letter: letter["reason"])
               | "CountReasons" >> beam.combiners.Count.PerElement())
    _ = (
        pipeline
        | "SummaryStart" >> beam.Create([None])
        | "Summary" >> beam.Map(make_summary, lines_in=AsSingleton(count("Lines", lines)),
                                answered=AsSingleton(count("Answered", answers)),
                                dead_lettered=AsSingleton(count("DeadLettered", dead_letters)),
                                response_tokens=AsSingleton(tokens), reasons=AsDict(reasons))
        | "FormatSummary" >> beam.Map(json.dumps)
        | "WriteSummary" >> beam.io.WriteToText(path, shard_name_template="", num_shards=1)
    )


def make_model_handler(args: argparse.Namespace, streaming: bool) -> GenerateHandler:
    return GenerateHandler(
        model_name=args.model_name,
        state_dict_path=args.state_dict_path,
        max_new_tokens=args.max_new_tokens,
        dtype=args.dtype,
        require_gpu=args.require_gpu,
        min_batch_size=args.min_batch_size,
        max_batch_size=args.max_batch_size,
        # Cross-bundle batching needs a stateful DoFn; it only makes sense in streaming.
        max_batch_duration_secs=args.max_batch_duration_secs if streaming else None,
        group_by_length=args.group_by_length,
        model_copies=args.model_copies,
        architecture=args.architecture,
        model_version=args.model_version or args.model_label or args.model_name,
        refresh_folder=args.model_refresh_folder if streaming else None,
        refresh_poll_s=args.model_refresh_interval_s if streaming and args.model_refresh_folder
        and args.model_refresh == "poll" else 0,
    )


def model_versions(pipeline: beam.Pipeline, args: argparse.Namespace, streaming: bool):
    """Beam's automatic model refresh: WatchFilePattern on the deployment's pointer folder, as RunInference's
    model metadata side input (each new pointer goes to the handler's ``update_model_path``). None without a
    folder, or where the handler polls it instead (``--model-refresh poll``)."""
    if not (streaming and args.model_refresh_folder and args.model_refresh == "side_input"):
        return None
    from apache_beam.ml.inference.utils import WatchFilePattern

    return pipeline | "WatchModelVersions" >> WatchFilePattern(
        args.model_refresh_folder.rstrip("/") + "/*.json", interval=args.model_refresh_interval_s)


def build_pipeline(
    pipeline: beam.Pipeline, args: argparse.Namespace, model_handler: ModelHandler | None = None
) -> None:
    streaming = bool(args.messages_subscription)
    handler = None if args.engine == "vllm" else model_handler or make_model_handler(args, streaming)
    if streaming:
        from apache_beam.io.gcp.pubsub import ReadFromPubSub

        records = (
            pipeline
            | "ReadPrompts" >> ReadFromPubSub(subscription=args.messages_subscription, with_attributes=True)
            | "ToRecord" >> beam.Map(pubsub_to_record)
        )
    else:
        lines = pipeline | "ReadPrompts" >> beam.io.ReadFromText(args.input, coder=beam.coders.BytesCoder())
        parsed = lines | "ParseLines" >> beam.FlatMap(parse_jsonl_line).with_outputs(
            ValidatePrompt.DEAD_LETTER, main="records")
        unique = (
            parsed.records
            | "GroupById" >> beam.GroupByKey()
            | "OnePerId" >> beam.FlatMap(first_of_each_id).with_outputs(ValidatePrompt.DEAD_LETTER, main="records")
        )
        bad_lines = (parsed[ValidatePrompt.DEAD_LETTER], unique[ValidatePrompt.DEAD_LETTER]) | "BadLines" >> beam.Flatten()
        records = unique.records

    validated = records | "Validate" >> beam.ParDo(
        ValidatePrompt(args.model_name, args.max_input_tokens, args.chat_template)
    ).with_outputs(ValidatePrompt.DEAD_LETTER, main="prompts")
    model_label = args.model_label or args.model_name
    if args.engine == "vllm":  # the server tokenizes by itself: the prompt's text goes, keyed by its id
        inputs = validated.prompts | "ToKeyedText" >> beam.Map(lambda element: (element[0], element[1]))
        run_inference = RunInference(model_handler or make_vllm_handler(args),
                                     inference_args=vllm_inference_args(args)).with_exception_handling()
        route = beam.FlatMap(route_completion, model=args.model_version or model_label)
    else:
        inputs = validated.prompts
        run_inference = RunInference(handler, model_metadata_pcoll=model_versions(pipeline, args, streaming)
                                     ).with_exception_handling()
        route = beam.FlatMap(route_prediction)
    if args.accelerator_hint:
        # Right fitting: only this step asks for the GPU; reading, validating and writing run on CPU workers.
        run_inference = run_inference.with_resource_hints(accelerator=args.accelerator_hint)
    predictions, failures = inputs | "RunInference" >> run_inference
    routed = predictions | "Route" >> route.with_outputs(ValidatePrompt.DEAD_LETTER, main="answers")
    failed_batches = failures.failed_inferences | "FailedBatches" >> beam.FlatMap(failed_batch_to_dead_letters)
    dead_letter_parts = [validated[ValidatePrompt.DEAD_LETTER], routed[ValidatePrompt.DEAD_LETTER], failed_batches]
    if not streaming:
        dead_letter_parts.append(bad_lines)
    dead_letters = dead_letter_parts | "AllDeadLetters" >> beam.Flatten()

    if streaming:
        from apache_beam.io.gcp.pubsub import WriteToPubSub

        _ = (
            routed.answers
            | "AnswerMessages" >> beam.Map(answer_to_pubsub)
            | "WriteAnswers" >> WriteToPubSub(args.responses_topic, with_attributes=True)
        )
        _ = (
            dead_letters
            | "DeadLetterMessages" >> beam.Map(dead_letter_to_pubsub)
            | "WriteDeadLetters" >> WriteToPubSub(args.dead_letter_topic, with_attributes=True)
        )
    else:
        answers_path, dead_letters_path, summary_path = output_paths(args.output, args.dead_letter_output)
        write_summary(pipeline, lines, routed.answers, dead_letters, summary_path)
        for label, collection, path in (
            ("Answers", routed.answers, answers_path),
            ("DeadLetters", dead_letters, dead_letters_path),
        ):
            _ = (
                collection
                | f"Format{label}" >> beam.Map(json.dumps)
                | f"Write{label}" >> beam.io.WriteToText(path, shard_name_template="", num_shards=1)
            )


def run(argv: Sequence[str] | None = None, save_main_session: bool = True, test_pipeline=None, model_handler=None,
        wait: bool = True):
    """Entry point, shaped like Beam's RunInference examples."""
    args, pipeline_args = parse_args(argv)
    options = PipelineOptions(pipeline_args)
    options.view_as(SetupOptions).save_main_session = save_main_session
    if args.messages_subscription:
        options.view_as(StandardOptions).streaming = True
    pipeline = test_pipeline or beam.Pipeline(options=options)
    build_pipeline(pipeline, args, model_handler)
    if test_pipeline is not None:
        return None
    result = pipeline.run()
    # gpuflow's launcher waits for this line before it reports the pipeline as started.
    log.info("gpuflow: pipeline running (%s)", "streaming" if args.messages_subscription else "batch")
    if wait:  # a Flex Template launcher returns once the job is submitted
        result.wait_until_finish()
    return result


if __name__ == "__main__":
    logging.getLogger().setLevel(logging.INFO)
    run()
