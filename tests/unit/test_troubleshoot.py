"""The classifier on error text as Dataflow and Beam print it, and the zone-exhaustion fallback plan."""

import pytest

from gpuflow.configuration.loading import load_config
from gpuflow.gpus.troubleshoot import classify
from gpuflow.steps.placements import FallbacksExhausted, next_placement, worth_a_fallback

REAL_ERRORS = {
    "ZONE_RESOURCE_POOL_EXHAUSTED": (
        "Workflow failed. Causes: Startup of the worker pool in zone us-central1-a failed to bring up any of the "
        "desired 1 workers. ZONE_RESOURCE_POOL_EXHAUSTED: Instance 'llm-inference-11290915-x8ps-harness-7q2k' "
        "creation failed: The zone 'projects/my-project/zones/us-central1-a' does not have enough resources "
        "available to fulfill the request.  Try a different zone, or try again later."
    ),
    "ZONE_RESOURCE_POOL_EXHAUSTED ": (
        "Startup of the worker pool in zone us-east4-c failed to bring up any of the desired 1 workers. "
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS: Instance 'gf-1-harness-abcd' creation failed: The zone "
        "'projects/p/zones/us-east4-c' does not have enough resources available to fulfill the request.  "
        "'(resource type:compute)'."
    ),
    # Region-wide wording, without "in zone" and without the code: the stock-out is still recognised.
    "ZONE_RESOURCE_POOL_EXHAUSTED  ": (
        "Startup of the worker pool in us-central1 failed to bring up any of the desired 1 workers. The zone "
        "'projects/p/zones/us-central1-c' does not have enough resources available to fulfill the request."
    ),
    "QUOTA_EXCEEDED": (
        "Startup of the worker pool in zone us-central1-b failed to bring up any of the desired 1 workers. "
        "QUOTA_EXCEEDED: Instance 'gf-2-harness-0' creation failed: Quota 'NVIDIA_L4_GPUS' exceeded.  "
        "Limit: 0.0 in region us-central1."
    ),
    "PYTHON_MISMATCH": (
        'Error message from worker: Traceback (most recent call last):\n  File "apache_beam/runners/worker/'
        'sdk_worker.py", line 300, in _execute\n    response = task()\nSystemError: unknown opcode'
    ),
    "PICKLER_MISMATCH": (
        "AttributeError: Can't get attribute '_create_code' on <module 'dill._dill' from "
        "'/usr/local/lib/python3.11/site-packages/dill/_dill.py'>"
    ),
    "GPU_OUT_OF_MEMORY": (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "22.06 GiB of which 1.19 GiB is free. [while running 'RunInference/BeamML_RunInference']"
    ),
    "GPU_OUT_OF_MEMORY  ": "RuntimeError: CUDA error: cudaErrorMemoryAllocation: out of memory",
    "MISSING_BOOT_ENTRYPOINT": (
        'Error syncing pod, failed to "StartContainer" for "sdk-0-0" with RunContainerError: "failed to create '
        'containerd task: exec: \\"/opt/apache/beam/boot\\": stat /opt/apache/beam/boot: no such file or directory"'
    ),
    "WORKERS_NEVER_STARTED": (
        "Workflow failed. Causes: The Dataflow job appears to be stuck because no worker activity has been seen "
        "in the last 1h. Please check the worker logs in Stackdriver Logging."
    ),
    "WORKERS_NEVER_STARTED ": (
        "Startup of the worker pool in us-central1 failed to bring up any of the desired 2 workers."
    ),
    "NO_GPU_USAGE": (
        "WARNING:apache_beam.ml.inference.pytorch_inference:Model handler specified a 'GPU' device, but GPUs are "
        "not available. Switching to CPU."
    ),
    "NO_GPU_USAGE ": "RuntimeError: PyTorch failed to detect GPUs with your setup",
}


@pytest.mark.parametrize(("expected", "text"), list(REAL_ERRORS.items()))
def test_real_error_text_is_classified_with_a_fix(expected, text):
    diagnosis = classify(text)
    assert diagnosis is not None and diagnosis.code == expected.strip()
    assert diagnosis.fix


def test_unknown_text_is_not_guessed():
    assert classify("Job finished successfully.") is None


def test_only_zone_exhaustion_triggers_fallbacks():
    assert classify(REAL_ERRORS["ZONE_RESOURCE_POOL_EXHAUSTED"]).try_fallback
    assert not classify(REAL_ERRORS["QUOTA_EXCEEDED"]).try_fallback


def config_with_fallbacks():
    return load_config(None, overrides=[
        "gpu.fallbacks=[{region: southamerica-east1}, {region: us-east4}, "
        "{type: nvidia-tesla-t4, machine_type: n1-standard-8}]",
        "model.dtype=float32",
    ])


def place(config, error_in):
    """The launch task's loop over placements: ``error_in`` answers each placement's start (None: it started)."""
    failures, after, attempts = [], 0, []
    while True:
        placement = next_placement(config, after, failures)
        attempts.append((placement.config.region, placement.config.gpu.type))
        error = error_in(placement.config)
        if error is None:
            return attempts
        if not worth_a_fallback(placement, error, failures):
            raise RuntimeError(error)
        after = placement.number


def test_fallbacks_are_tried_in_order_each_rechecked_by_preflight(caplog):
    def error_in(config):
        return REAL_ERRORS["ZONE_RESOURCE_POOL_EXHAUSTED"] if config.region == "us-central1" else None

    with caplog.at_level("INFO"):
        attempts = place(config_with_fallbacks(), error_in)
    # southamerica-east1 offers no L4: preflight refuses it, so it is never attempted.
    assert attempts == [("us-central1", "nvidia-l4"), ("us-east4", "nvidia-l4")]
    assert "attempt 2/4" in caplog.text and "refuses it" in caplog.text and "attempt 3/4" in caplog.text


def test_other_errors_are_not_retried_elsewhere():
    with pytest.raises(RuntimeError, match="QUOTA_EXCEEDED"):
        place(config_with_fallbacks(), lambda config: REAL_ERRORS["QUOTA_EXCEEDED"])


def test_all_fallbacks_exhausted_says_so():
    with pytest.raises(FallbacksExhausted, match="2/4: .* refused by preflight.*attempt 4/4: 1 x nvidia-tesla-t4"):
        place(config_with_fallbacks(), lambda config: REAL_ERRORS["ZONE_RESOURCE_POOL_EXHAUSTED"])
