"""RunInference model handlers: gpuflow's batched ``generate`` handler (seq2seq or decoder-only, with model
versions that switch while the job runs) and Beam's vLLM handler fitted to a model exported to Cloud Storage."""

import argparse
import logging
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from apache_beam.ml.inference.base import ModelHandler, PredictionResult

from download_model import SAVE_PRETRAINED_DIR  # where the export's save_pretrained folder lies
from llm_models import (
    LoadedModel,
    ModelVersion,
    choose_device_and_dtype,
    list_files,
    load_model,
    load_tokenizer,
    materialize_model_dir,
    model_architecture,
)
from prompt_io import PromptElement

log = logging.getLogger("gpuflow.llm_inference")

#: Token-length bucket boundaries for --group-by-length.
LENGTH_BUCKETS = [16, 32, 64, 128, 256, 512]


def prompt_token_length(element: PromptElement) -> int:
    return len(element[2])


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
        started = time.monotonic()
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
        # generated, batch size, seconds its batch took to generate), or an error. A prompt waits for its whole
        # batch, so the batch's time is its latency (a rollout's evaluation compares them: gpuflow.runs.rollout_gate).
        seconds = round(time.monotonic() - started, 6)
        return [PredictionResult(element, answer if isinstance(answer, dict) else (*answer, len(batch), seconds),
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
