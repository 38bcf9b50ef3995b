"""Export a model's weights as a bf16 PyTorch ``state_dict``, as in the Dataflow LLM guide: a seq2seq model (the
guide's FLAN-T5) or a decoder-only one (Gemma, Llama, Mistral class), told apart by its config.

Two modes, as in the guide:

    python download_model.py local --model-name NAME_OR_DIR --state-dict-path PATH_OR_GS_URI
    python download_model.py vertex --model-name NAME --state-dict-path gs://... --job-name J \
        --project P --bucket gs://B [--location us-central1 --machine-type e2-highmem-2 --disk-size-gb 100]

``local`` also writes the model's config and tokenizer beside the weights, so the pipeline can
read everything from one directory. ``vertex`` runs ``local`` inside a Vertex AI custom job.
Self-contained on purpose: the Vertex job runs this file alone.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence

log = logging.getLogger("gpuflow.download_model")

# The export runs on CPU (e2) machines: the prebuilt PyTorch CPU training image
# (cloud.google.com/vertex-ai/docs/training/pre-built-containers).
VERTEX_CONTAINER = "us-docker.pkg.dev/vertex-ai/training/pytorch-cpu.2-4.py310:latest"
#: `vertex` mode's installs: the exact pins of gpuflow's docker/locks/export.in (a test keeps them equal), which load
#: models on that image's torch 2.4; an unpinned transformers resolves to 5.x, which turns PyTorch off below 2.6.
VERTEX_REQUIREMENTS = ["transformers==4.57.6", "sentencepiece==0.2.3", "safetensors==0.8.0",
                       "google-cloud-storage==3.17.1"]
#: Written beside the weights once everything is there: {"model_name", "dtype", "state_dict_bytes"}.
EXPORT_MARKER = "gpuflow_export.json"


def _open_for_write(path: str):
    if path.startswith("gs://"):
        # The storage client streams in chunks (resumable upload), so the weights are never buffered whole.
        from google.cloud import storage

        bucket_name, _, blob_name = path.removeprefix("gs://").partition("/")
        return storage.Client().bucket(bucket_name).blob(blob_name).open("wb", chunk_size=8 * 1024 * 1024, ignore_flush=True)
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    return open(path, "wb")


def _copy_dir_files(local_dir: str, target_dir: str) -> None:
    for name in sorted(os.listdir(local_dir)):
        source = os.path.join(local_dir, name)
        if os.path.isfile(source):
            with open(source, "rb") as reader, _open_for_write(f"{target_dir.rstrip('/')}/{name}") as writer:
                shutil.copyfileobj(reader, writer)


class _CountingWriter:
    """Counts bytes on their way to the target, for progress logs."""

    def __init__(self, target):
        self.target, self.written = target, 0

    def write(self, data) -> int:
        self.written += len(data)
        return self.target.write(data)

    def flush(self) -> None:
        flush = getattr(self.target, "flush", None)
        if flush:
            flush()


#: Beside the weights, with --save-pretrained: the folder vLLM serves (safetensors, config, tokenizer).
SAVE_PRETRAINED_DIR = "hf"


def run_local(model_name: str, state_dict_path: str, record_as: str | None = None,
              save_pretrained: bool = False) -> int:
    """Load in bf16 (no fp32 copy), stream the state_dict to its target; returns bytes written. With
    ``save_pretrained``, also the model as safetensors with its config and tokenizer in ``hf/`` beside it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

    architecture = "seq2seq" if AutoConfig.from_pretrained(model_name).is_encoder_decoder else "causal"
    auto_class = AutoModelForSeq2SeqLM if architecture == "seq2seq" else AutoModelForCausalLM
    log.info("loading %s (%s) in bfloat16", model_name, architecture)
    model = auto_class.from_pretrained(model_name, dtype=torch.bfloat16, low_cpu_mem_usage=True)
    state_dict = model.state_dict()
    tensor_bytes = sum(t.numel() * t.element_size() for t in state_dict.values())
    log.info("converted: %d tensors, %.1f MB in bf16; writing %s", len(state_dict), tensor_bytes / 1e6, state_dict_path)
    with _open_for_write(state_dict_path) as target:
        counter = _CountingWriter(target)
        torch.save(state_dict, counter)
    log.info("wrote %d bytes to %s", counter.written, state_dict_path)

    # Config and tokenizer beside the weights; small, so a local temp directory is fine.
    with tempfile.TemporaryDirectory() as staging:
        AutoConfig.from_pretrained(model_name).save_pretrained(staging)
        AutoTokenizer.from_pretrained(model_name).save_pretrained(staging)
        target_dir = state_dict_path.rsplit("/", 1)[0] if "/" in state_dict_path else "."
        _copy_dir_files(staging, target_dir)
    log.info("wrote config and tokenizer to %s", target_dir)
    if save_pretrained:
        with tempfile.TemporaryDirectory() as staging:
            model.save_pretrained(staging, safe_serialization=True)
            AutoTokenizer.from_pretrained(model_name).save_pretrained(staging)
            _copy_dir_files(staging, f"{target_dir}/{SAVE_PRETRAINED_DIR}")
        log.info("wrote the save_pretrained folder (safetensors) to %s/%s", target_dir, SAVE_PRETRAINED_DIR)
    # Written last: its presence means the export is whole, so a later run can skip it.
    marker = {"model_name": record_as or model_name, "dtype": "bfloat16", "state_dict_bytes": counter.written,
              "architecture": architecture, "save_pretrained": save_pretrained}
    with _open_for_write(f"{target_dir}/{EXPORT_MARKER}") as writer:
        writer.write(json.dumps(marker).encode())
    log.info("export complete: %s", marker)
    return counter.written


def gcs_fuse_path(uri: str) -> str:
    """Vertex AI custom jobs mount Cloud Storage under /gcs/."""
    return "/gcs/" + uri.removeprefix("gs://") if uri.startswith("gs://") else uri


def vertex_job_args(model_name: str, state_dict_path: str) -> list[str]:
    return ["local", f"--model-name={model_name}", f"--state-dict-path={gcs_fuse_path(state_dict_path)}"]


def run_vertex_job(
    model_name: str,
    state_dict_path: str,
    job_name: str,
    project: str,
    bucket: str,
    location: str = "us-central1",
    machine_type: str = "e2-highmem-2",
    disk_size_gb: int = 100,
) -> None:
    """Run ``local`` mode in a Vertex AI custom job, as the guide does."""
    from google.cloud import aiplatform

    aiplatform.init(project=project, staging_bucket=bucket, location=location)
    job = aiplatform.CustomJob.from_local_script(
        display_name=job_name,
        container_uri=VERTEX_CONTAINER,
        script_path=os.path.abspath(__file__),
        args=vertex_job_args(model_name, state_dict_path),
        machine_type=machine_type,
        boot_disk_size_gb=disk_size_gb,
        requirements=VERTEX_REQUIREMENTS,
    )
    job.run()


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    modes = parser.add_subparsers(dest="mode", required=True)
    local = modes.add_parser("local", help="export on this machine")
    vertex = modes.add_parser("vertex", help="export in a Vertex AI custom job")
    for sub in (local, vertex):
        sub.add_argument("--model-name", "--model_name", dest="model_name", required=True)
        sub.add_argument("--state-dict-path", "--state_dict_path", dest="state_dict_path", required=True)
    local.add_argument("--record-as", help="the model name the export marker records (default: --model-name)")
    local.add_argument("--save-pretrained", action="store_true",
                       help=f"also write {SAVE_PRETRAINED_DIR}/ beside the weights: safetensors, config, tokenizer (vLLM)")
    vertex.add_argument("--job-name", required=True)
    vertex.add_argument("--project", required=True)
    vertex.add_argument("--bucket", required=True)
    vertex.add_argument("--location", default="us-central1")
    vertex.add_argument("--machine-type", default="e2-highmem-2")
    vertex.add_argument("--disk-size-gb", type=int, default=100)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = build_arg_parser().parse_args(argv)
    if args.mode == "local":
        run_local(args.model_name, args.state_dict_path, args.record_as, args.save_pretrained)
    else:
        run_vertex_job(
            args.model_name, args.state_dict_path, args.job_name, args.project, args.bucket,
            args.location, args.machine_type, args.disk_size_gb,
        )


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    main()
