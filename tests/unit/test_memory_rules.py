"""The GPU memory and sharing rules, applied as a new user would: each finding's fix, as written, clears it."""

import re

import pytest

from gpuflow.configuration.loading import load_config
from gpuflow.dataflow.gpu_options import effective_sharing, resident_copies
from gpuflow.preflight import run_preflight


def findings(*overrides, config_file=None):
    return run_preflight(load_config(config_file, overrides=list(overrides)), check_environment=False)


def test_model_copies_without_their_sharing_is_said_and_the_fix_clears_it():
    def copies_findings(*overrides):
        config = load_config("configs/gcp.example.yaml", overrides=["project=acme-ml-prod", *overrides])
        return [f for f in run_preflight(config, check_environment=False) if f.field == "gpu.model_copies"]

    (finding,) = copies_findings("gpu.model_copies=2")
    assert finding.level == "warning" and "ignored" in finding.problem
    assert copies_findings("gpu.model_copies=2", "gpu.sharing=model_copies") == []


# -- sharing counts processes x copies x one copy's memory, in every mode ------------------------------------------


GCP = ["profile=gcp", "project=acme-ml-prod"]  # the sharing notes are said where Dataflow runs the workers


def sharing_problems(*overrides):
    return [f for f in findings(*GCP, *overrides) if f.level in ("error", "warning")
            and f.field in ("gpu.sharing", "gpu.model_copies", "gpu.machine_type")]


@pytest.mark.parametrize("base", [
    # flan-t5-xl on an L4 (24 GB): 8 SDK processes x 6.8 GB; flan-t5-large on a T4 (16 GB): 8 x 3.8 GB
    ["model.name=google/flan-t5-xl", "gpu.machine_type=g2-standard-8"],
    ["model.name=google/flan-t5-large", "gpu.type=nvidia-tesla-t4", "gpu.machine_type=n1-standard-8",
     "model.dtype=float32"],
], ids=["flan-t5-xl-l4", "flan-t5-large-t4"])
def test_sharing_counts_every_copy_and_each_fix_as_written_clears_its_finding(base):
    # auto: 8 copies do not fit, so one SDK process, said with the numbers, and nothing to fix
    assert effective_sharing(load_config(None, overrides=base)) == "single_process"
    assert sharing_problems(*base) == []
    (note,) = [f for f in findings(*GCP, *base) if f.field == "gpu.sharing" and f.level == "info"]
    assert "no_use_multiple_sdk_containers" in note.fix and "8 processes" in note.fix

    # MPS shares compute, not memory: each of the 8 processes still loads a copy
    (mps,) = sharing_problems(*base, "gpu.sharing=mps")
    assert mps.level == "error" and "8 SDK processes" in mps.problem and "own model copy" in mps.problem
    copies = int(re.search(r"gpu\.model_copies: (\d+)", mps.fix).group(1))
    assert copies >= 2
    # each fix, applied as written, clears it
    assert sharing_problems(*base, "gpu.sharing=model_copies", f"gpu.model_copies={copies}") == []
    assert sharing_problems(*base, "gpu.sharing=single_process") == []
    assert sharing_problems(*base, "gpu.sharing=auto") == []
    # one copy more than the fix says does not fit
    (too_many,) = sharing_problems(*base, "gpu.sharing=model_copies", f"gpu.model_copies={copies + 1}")
    assert too_many.field == "gpu.model_copies" and f"gpu.model_copies to {copies}" in too_many.fix


def test_a_small_model_keeps_dataflows_default_of_a_copy_per_process():
    overrides = ["model.name=google/flan-t5-base", "gpu.machine_type=g2-standard-8"]
    assert effective_sharing(load_config(None, overrides=overrides)) == "default"
    assert sharing_problems(*overrides) == [] and sharing_problems(*overrides, "gpu.sharing=mps") == []


def test_vllm_serves_one_copy_per_worker_so_no_sharing_advice_asks_for_another_mode():
    vllm = ["model.name=meta-llama/Llama-3.1-8B", "inference.engine=vllm", "container.recipe=vllm",
            "gpu.machine_type=g2-standard-8"]
    config = load_config(None, overrides=vllm)
    assert (effective_sharing(config), resident_copies(config)) == ("default", 1)
    found = findings(*GCP, *vllm)
    assert [f for f in found if f.field in ("gpu.sharing", "gpu.model_copies") and f.level != "info"] == []
    (note,) = [f for f in found if f.field == "gpu.sharing" and f.level == "info"]
    assert "vLLM server per worker" in note.fix
