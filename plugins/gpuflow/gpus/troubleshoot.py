"""From a failed job's error text to its cause and fix (the fallback plan for exhausted zones: ``placements``).

The patterns are the symptoms the Dataflow GPU troubleshooting guide lists, as they appear in Dataflow
job messages, worker logs and Beam's own log lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Diagnosis:
    code: str
    cause: str
    fix: str
    try_fallback: bool = False


_SYMPTOMS: list[tuple[str, re.Pattern[str], str, str, bool]] = [
    ("ZONE_RESOURCE_POOL_EXHAUSTED",
     re.compile(r"ZONE_RESOURCE_POOL_EXHAUSTED(_WITH_DETAILS)?|does not have enough resources available", re.I),
     "the zone has no free GPUs of this type right now (a stock-out, not a quota problem)",
     "leave gpu.zone empty so Dataflow can pick another zone, add gpu.fallbacks (another region or GPU type), "
     "or try again later", True),
    ("QUOTA_EXCEEDED",
     re.compile(r"QUOTA_EXCEEDED|Quota '([A-Z0-9_]+)' exceeded", re.I),
     "the project's regional GPU quota is smaller than gpu.count x worker.max_num_workers",
     "request more quota for the GPU metric in the region (IAM & Admin > Quotas), or lower "
     "worker.max_num_workers; `gpu_quota_report` shows the headroom", False),
    ("PYTHON_MISMATCH",
     re.compile(r"SystemError: unknown opcode", re.I),
     "the launch environment and the worker container run different Python minor versions",
     "build the container with the launcher's Python (python_version) or launch from the container's Python",
     False),
    ("PICKLER_MISMATCH",
     re.compile(r"UnpicklingError|PicklingError|Can't get attribute '[^']+' on <module|"
                r"code\(\) argument \d+ must be|Could not (de)?serialize", re.I),
     "the pipeline was pickled by a launcher whose Beam, dill/cloudpickle or Python differs from the container's",
     "use the same Beam version (beam_version) and Python minor version in the launch environment and image",
     False),
    ("GPU_OUT_OF_MEMORY",
     re.compile(r"CUDA out of memory|cudaErrorMemoryAllocation|CUDA error: out of memory|OutOfMemoryError", re.I),
     "the model copies and batches do not fit in the GPU's memory",
     "use one SDK process per worker (--experiments=no_use_multiple_sdk_containers), lower "
     "inference.max_batch_size, use bfloat16, or a GPU with more memory", False),
    ("MISSING_BOOT_ENTRYPOINT",
     re.compile(r"/opt/apache/beam/boot: no such file|exec: \"/opt/apache/beam/boot\"|"
                r"failed to \\?\"StartContainer\\?\".*CrashLoopBackOff", re.I),
     "the worker container cannot start the Beam SDK harness",
     "copy /opt/apache/beam from apache/beam_pythonX.Y_sdk into the image and set "
     'ENTRYPOINT ["/opt/apache/beam/boot"] (every gpuflow recipe does)', False),
    ("WORKERS_NEVER_STARTED",
     re.compile(r"no worker activity has been seen|workers? (failed to|did not|never) start|"
                # "... in zone us-central1-a failed ..." or, region-wide, "... in us-central1 failed ..."
                r"Startup of the worker pool in (zone )?\S+ failed to bring up any of the desired", re.I),
     "the workers never came up: usually the image (too large for the disk, wrong entrypoint) or the driver",
     "set worker.disk_size_gb to 50 or more, check the image with `gpuflow debug-vm`, and read the worker "
     "startup logs", False),
    ("SHIELDED_VM_REQUIRED",
     re.compile(r"constraints/compute\.requireShieldedVm", re.I),
     "the organisation policy constraints/compute.requireShieldedVm blocks accelerated Dataproc Serverless batches",
     "ask an organisation admin to exempt the project from constraints/compute.requireShieldedVm, or run the "
     "batch in a project outside that policy", False),
    ("NO_GPU_USAGE",
     re.compile(r"failed to detect GPUs with your setup|GPUs are not available\. Switching to CPU|"
                r"cuda_available\W+false", re.I),
     "the workers run without a GPU: no accelerator attached, no driver installed, or a CPU build of torch",
     "send worker_accelerator=type:...;count:...;install-nvidia-driver (gpuflow builds it from gpu.*), use a "
     "CUDA build of torch in the image, and set require_gpu: true to fail instead of paying for idle GPUs", False),
]


def classify(text: str) -> Diagnosis | None:
    """The first known symptom in ``text``; None when nothing matches."""
    for code, pattern, cause, fix, try_fallback in _SYMPTOMS:
        if pattern.search(text):
            return Diagnosis(code, cause, fix, try_fallback)
    return None
