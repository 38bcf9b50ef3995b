"""Loading a model and generating batched answers: the part of the inference pipeline that needs no Beam.

beam_jobs/llm_inference.py (the pipeline) imports it; so can a machine that has torch and transformers but no
Beam (benchmarks/gpu_check.sh runs it on a lent GPU machine). The recipes put beam_jobs/ on the workers'
PYTHONPATH, where the pipeline's pickled functions find it.
"""

import contextlib
import os
import tempfile
from collections.abc import Sequence

#: Files a model directory needs besides the weights (config and tokenizer).
_MODEL_DIR_SUFFIXES = (".json", ".model", ".txt")


def _gcs_bucket_and_name(uri: str):
    """(bucket, object name) of a gs:// URI. The storage client honours STORAGE_EMULATOR_HOST for local runs."""
    from google.cloud import storage

    bucket_name, _, name = uri.removeprefix("gs://").partition("/")
    return storage.Client().bucket(bucket_name), name


def materialize_model_dir(model_name: str, with_weights: bool = False) -> str:
    """Return a local directory or hub name for ``from_pretrained``; copies a ``gs://`` directory down (its config
    and tokenizer; ``with_weights``: every file, for vLLM, which serves a local folder)."""
    if not model_name.startswith("gs://"):
        return model_name
    local_dir = tempfile.mkdtemp(prefix="gpuflow-model-")
    bucket, prefix = _gcs_bucket_and_name(model_name.rstrip("/") + "/")
    for blob in bucket.list_blobs(prefix=prefix, delimiter="/"):  # the directory's own files, not subfolders
        name = blob.name.rsplit("/", 1)[-1]
        if with_weights or name.endswith(_MODEL_DIR_SUFFIXES):  # else weights come from --state-dict-path
            blob.download_to_filename(os.path.join(local_dir, name))
    return local_dir


#: What --architecture takes: auto reads the model's config (an encoder-decoder is seq2seq, else causal).
ARCHITECTURES = ("auto", "seq2seq", "causal")


def model_architecture(model_dir: str, requested: str = "auto") -> str:
    """seq2seq (T5 class) or causal (decoder-only: Gemma, Llama, Mistral class)."""
    if requested != "auto":
        return requested
    from transformers import AutoConfig

    return "seq2seq" if AutoConfig.from_pretrained(model_dir).is_encoder_decoder else "causal"


def load_tokenizer(model_dir: str):
    """The model's tokenizer; one without a pad token (most decoder-only ones) pads with its end-of-sequence."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def read_text(uri: str) -> str:
    """A small file's text, local or gs://."""
    if uri.startswith("gs://"):
        bucket, name = _gcs_bucket_and_name(uri)
        return bucket.blob(name).download_as_text()
    with open(uri, encoding="utf-8") as file:
        return file.read()


def list_files(folder: str, suffix: str) -> list[str]:
    """The files directly in ``folder`` (local or gs://) whose names end in ``suffix``, sorted by name."""
    if folder.startswith("gs://"):
        bucket, prefix = _gcs_bucket_and_name(folder.rstrip("/") + "/")
        scheme = f"gs://{bucket.name}/"
        return sorted(scheme + blob.name for blob in bucket.list_blobs(prefix=prefix, delimiter="/")
                      if blob.name.endswith(suffix))
    if not os.path.isdir(folder):
        return []
    return sorted(os.path.join(folder, name) for name in os.listdir(folder) if name.endswith(suffix))


class ModelVersion:
    """One version of a served model: its id (the id each answer carries) and its weights. A deployment's rollout
    writes a *pointer* (a small JSON file: the id, the weights, and for a person the version's folder) into the
    folder that RunInference watches, so that switching versions, or back, is writing one new file."""

    def __init__(self, version: str, state_dict_path: str):
        self.version, self.state_dict_path = version, state_dict_path

    @classmethod
    def from_pointer(cls, uri: str) -> "ModelVersion":
        import json

        pointer = json.loads(read_text(uri))
        return cls(pointer["version"], pointer["state_dict_path"])

    def __repr__(self) -> str:
        return f"ModelVersion({self.version!r})"


def _open_state_dict(path: str, device: str):
    import torch

    if path.startswith("gs://"):
        # Download to local disk first so the tensors can be memory-mapped from there.
        bucket, name = _gcs_bucket_and_name(path)
        local_copy = os.path.join(tempfile.mkdtemp(prefix="gpuflow-weights-"), "state_dict.pth")
        bucket.blob(name).download_to_filename(local_copy)
        path = local_copy
    # mmap: tensors are paged in from the file instead of being read into fresh buffers first.
    return torch.load(path, map_location=device, weights_only=True, mmap=True)


def choose_device_and_dtype(dtype: str = "auto", require_gpu: bool = False):
    """cuda when present; bf16 where the GPU supports it, fp32 elsewhere. Never fp16 (T5 overflows)."""
    import torch

    if torch.cuda.is_available():
        device = "cuda"
    elif require_gpu:
        raise RuntimeError(
            "require_gpu is set but PyTorch sees no CUDA device on this worker. Check the "
            "worker_accelerator option (install-nvidia-driver), the container's CUDA build of torch, "
            "and LD_LIBRARY_PATH=/usr/local/nvidia/lib64; or set require_gpu: false to run on CPU."
        )
    else:
        device = "cpu"
    if dtype == "auto":
        use_bf16 = device == "cuda" and torch.cuda.is_bf16_supported()
        return device, torch.bfloat16 if use_bf16 else torch.float32
    if dtype not in ("bfloat16", "float32"):
        raise ValueError(f"dtype {dtype!r} is not supported: use auto, bfloat16 or float32 (fp16 overflows in T5)")
    return device, getattr(torch, dtype)


@contextlib.contextmanager
def _parameters_on_meta():
    """Every parameter created inside goes to the meta device (no memory, no initialisation), while buffers stay
    real: a rotary embedding's ``inv_freq`` is computed when the model is built and is no part of a state_dict."""
    import torch

    register = torch.nn.Module.register_parameter

    def register_on_meta(module, name, parameter):
        register(module, name, parameter)
        if parameter is not None:
            module._parameters[name] = torch.nn.Parameter(parameter.to("meta"), requires_grad=False)

    torch.nn.Module.register_parameter = register_on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


def load_model(model_dir: str, state_dict_path: str, device: str, dtype, architecture: str = "seq2seq"):
    """Build the model directly in ``dtype`` with its parameters on the meta device, and assign the saved tensors.

    No random initialisation runs and no fp32 copy of a bf16 checkpoint is ever made.
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM

    config = AutoConfig.from_pretrained(model_dir)
    auto_class = AutoModelForSeq2SeqLM if architecture == "seq2seq" else AutoModelForCausalLM
    with _parameters_on_meta():
        model = auto_class.from_config(config, dtype=dtype)
    state_dict = _open_state_dict(state_dict_path, device)
    state_dict = {key: tensor.to(device=device, dtype=dtype) for key, tensor in state_dict.items()}
    missing, unexpected = model.load_state_dict(state_dict, strict=False, assign=True)
    model.tie_weights()
    model.to(device)  # the buffers (the parameters are there already)
    still_meta = [name for name, tensor in model.state_dict().items() if tensor.is_meta]
    if still_meta or unexpected:
        raise RuntimeError(
            f"state_dict at {state_dict_path} does not fit the model config in {model_dir}: "
            f"missing {still_meta[:5]}, unexpected {list(unexpected)[:5]}. Re-export it with download_model.py."
        )
    del missing
    model.eval()
    return model


# ------------------------------------------------------------------------------------------
# Model handler


class LoadedModel:
    """What ``load_model`` hands to ``run_inference``: the model, its tokenizer and device.

    ``generate`` is its one entry point, so that a copy shared across SDK processes (model copies, Beam's
    multi-process sharing) is called with token ids and answers with strings, never moving the model.
    A seq2seq batch pads on the right; a causal one on the left, so that every prompt ends where its answer
    begins, and the answer is the new tokens alone, never the echoed prompt.
    """

    def __init__(self, model, tokenizer, device: str, architecture: str = "seq2seq",
                 source: ModelVersion | None = None):
        self.model, self.tokenizer, self.device, self.architecture = model, tokenizer, device, architecture
        self.source = source  # the version whose weights these are
        self.pointer: str | None = None  # the version pointer a deployment's job switched it to, if any

    @property
    def version(self) -> str:
        """The model version id each answer carries."""
        return self.source.version if self.source else ""

    def version_id(self) -> str:
        """The version id (a method, so that a copy shared across processes answers it through its proxy)."""
        return self.version

    def generate(self, token_lists: Sequence[list[int]], max_new_tokens: int) -> list[str]:
        """Greedy answers for a batch, padded with an attention mask, in one ``generate`` call."""
        return [text for text, _ in self.generate_counted(token_lists, max_new_tokens)]

    def generate_counted(self, token_lists: Sequence[list[int]], max_new_tokens: int) -> list[tuple[str, int]]:
        """Each answer with the number of tokens generated for it (neither padding nor end-of-sequence)."""
        import torch

        pad_id = self.model.config.pad_token_id
        if pad_id is None:
            pad_id = self.tokenizer.pad_token_id or 0
        causal = self.architecture == "causal"
        width = max(len(tokens) for tokens in token_lists)
        input_ids = torch.full((len(token_lists), width), pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(token_lists), width), dtype=torch.long)
        for row, tokens in enumerate(token_lists):
            where = slice(width - len(tokens), width) if causal else slice(0, len(tokens))
            input_ids[row, where] = torch.tensor(tokens, dtype=torch.long)
            attention_mask[row, where] = 1
        with torch.inference_mode():
            output = self.model.generate(
                input_ids=input_ids.to(self.device),
                attention_mask=attention_mask.to(self.device),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                num_beams=1,
                pad_token_id=pad_id,
            )
        # causal: what follows the (left-padded) prompts; seq2seq: what follows the decoder's start token
        generated = output[:, width:] if causal else output[:, 1:]
        eos_id = self.model.config.eos_token_id
        counts = ((generated != pad_id) & (generated != (eos_id if eos_id is not None else -1))).sum(dim=1)
        texts = self.tokenizer.batch_decode(generated, skip_special_tokens=True)
        return list(zip(texts, counts.tolist(), strict=True))
