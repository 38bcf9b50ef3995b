"""A Beam pipeline that reports whether its workers see a GPU, and fails when it must and they don't.

    python beam_jobs/gpu_check.py --report PATH_OR_GS_URI [--require-gpu] [Beam pipeline options]

It checks PyTorch, and TensorFlow where it is installed, with the messages the Dataflow GPU guide uses.
Self-contained on purpose: Dataflow workers run this file without the gpuflow package.
"""

import argparse
import json
import logging
import os
import platform
import shutil
import subprocess

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

log = logging.getLogger("gpuflow.gpu_check")

TORCH_NO_GPU = "PyTorch failed to detect GPUs with your setup"
TENSORFLOW_NO_GPU = "TensorFlow failed to detect GPUs with your setup"


class NoGpuError(RuntimeError):
    pass


def inspect_worker(_=None) -> dict:
    """What this worker sees: torch's CUDA devices, TensorFlow's GPUs (if installed), nvidia-smi."""
    report: dict = {"host": platform.node(), "python": platform.python_version(), "errors": []}
    try:
        import torch

        report["torch"] = {
            "version": torch.__version__,
            "cuda_build": torch.version.cuda,
            "cuda_available": torch.cuda.is_available(),
            "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        }
        if not report["torch"]["cuda_available"]:
            report["errors"].append(TORCH_NO_GPU)
    except ImportError:
        report["torch"] = None
    try:
        import tensorflow as tf  # optional: only checked where the image has it

        gpus = tf.config.list_physical_devices("GPU")
        report["tensorflow"] = {"version": tf.__version__, "devices": [gpu.name for gpu in gpus]}
        if not gpus:
            report["errors"].append(TENSORFLOW_NO_GPU)
    except ImportError:
        report["tensorflow"] = None
    nvidia_smi = shutil.which("nvidia-smi") or (
        "/usr/local/nvidia/bin/nvidia-smi" if os.path.exists("/usr/local/nvidia/bin/nvidia-smi") else None
    )
    if nvidia_smi:
        listing = subprocess.run([nvidia_smi, "-L"], capture_output=True, text=True, timeout=60)
        report["nvidia_smi"] = listing.stdout.strip().splitlines()
    else:
        report["nvidia_smi"] = None
    report["gpu_found"] = bool(report["torch"] and report["torch"]["cuda_available"]) or bool(
        report["tensorflow"] and report["tensorflow"]["devices"]
    )
    return report


def enforce(report: dict, require_gpu: bool) -> dict:
    if require_gpu and (report["errors"] or not report["gpu_found"]):
        reasons = "; ".join(report["errors"]) or "no GPU framework is installed in the worker image"
        raise NoGpuError(
            f"{reasons}. Worker {report['host']} sees no GPU. Check worker_accelerator (with "
            "install-nvidia-driver), the machine type, and the image's CUDA build."
        )
    return report


def write_report(report: dict, path: str) -> None:
    text = json.dumps(report, indent=2)
    if path.startswith("gs://"):
        from google.cloud import storage

        bucket, _, name = path.removeprefix("gs://").partition("/")
        storage.Client().bucket(bucket).blob(name).upload_from_string(text, content_type="application/json")
    else:
        with open(path, "w") as handle:
            handle.write(text)


def run(argv=None, test_pipeline=None, wait=True):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--report", required=True, help="where to write the JSON report")
    parser.add_argument("--require-gpu", "--require_gpu", dest="require_gpu", nargs="?", const="true",
                        default="false", choices=("true", "false"), help="fail when the workers see no GPU")
    parser.add_argument("--accelerator-hint", "--accelerator_hint", dest="accelerator_hint", default=None,
                        help="right fitting: Beam's accelerator resource hint, on the InspectWorker step alone")
    args, pipeline_args = parser.parse_known_args(argv)
    pipeline = test_pipeline or beam.Pipeline(options=PipelineOptions(pipeline_args))
    inspect = beam.Map(inspect_worker)
    if args.accelerator_hint:  # the step that must see the GPU runs where the hint puts it
        inspect = inspect.with_resource_hints(accelerator=args.accelerator_hint)
    _ = (
        pipeline
        | "One" >> beam.Create([None])
        | "InspectWorker" >> inspect
        | "Enforce" >> beam.Map(enforce, require_gpu=args.require_gpu == "true")
        | "WriteReport" >> beam.Map(write_report, path=args.report)
    )
    result = pipeline.run()
    if wait:  # a Flex Template launcher returns once the job is submitted
        result.wait_until_finish()
    return result


if __name__ == "__main__":
    logging.getLogger().setLevel(logging.INFO)
    run()
