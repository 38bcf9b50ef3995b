"""GenerateHandler's model versions, with a real exported model: Beam's automatic model refresh hands it pointers
(update_model_path), the local profile's handler polls the same folder, each answer names the version that gave it,
and a version that cannot load leaves the serving one in place."""

import json
import logging
import time

import pytest
import torch

from gpuflow.runs.rollout import pointer_name
from llm_handlers import GenerateHandler


def write_pointer(folder, version: str, state_dict, written_at: float | None = None) -> str:
    path = folder / pointer_name(version, written_at)
    path.write_text(json.dumps({"version": version, "model_dir": str(state_dict.parent),
                                "state_dict_path": str(state_dict)}))
    return str(path)


@pytest.fixture(scope="module")
def versions(exported_model, tmp_path_factory):
    """v1 (the export), v2 (the same model, other weights) and a bad one (a tensor of another shape)."""
    root = tmp_path_factory.mktemp("versions")
    weights = torch.load(exported_model, weights_only=True)
    torch.manual_seed(1)
    (root / "v2").mkdir()
    torch.save({k: v + torch.randn_like(v.float()).to(v.dtype) for k, v in weights.items()}, root / "v2" / "sd.pth")
    (root / "bad").mkdir()
    bad = dict(weights)
    bad["shared.weight"] = bad["shared.weight"][:, :8]
    torch.save(bad, root / "bad" / "sd.pth")
    return {"v1": exported_model, "v2": root / "v2" / "sd.pth", "bad": root / "bad" / "sd.pth"}


def batch_of(handler, prompts):
    from llm_models import load_tokenizer

    tokenizer = load_tokenizer(handler.model_name)
    return [(f"p{i}", prompt, tokenizer(prompt)["input_ids"]) for i, prompt in enumerate(prompts)]


PROMPTS = ["what is the capital of france", "describe a green mountain", "tell me about the river"]


def answers(handler, loaded):
    return [(result.model_id, result.inference[0]) for result in handler.run_inference(batch_of(handler, PROMPTS),
                                                                                        loaded)]


def test_polling_switches_to_a_new_version_and_keeps_the_old_one_when_the_new_cannot_load(
        versions, tmp_path, caplog):
    pointers = tmp_path / "live"
    pointers.mkdir()
    write_pointer(pointers, "m@stale", versions["bad"], written_at=time.time() - 60)  # older than the job
    handler = GenerateHandler(str(versions["v1"].parent), str(versions["v1"]), max_new_tokens=4,
                              model_version="m@v1", refresh_folder=str(pointers), refresh_poll_s=0.001)
    loaded = handler.load_model()
    first = answers(handler, loaded)
    assert {version for version, _ in first} == {"m@v1"}

    write_pointer(pointers, "m@v2", versions["v2"])
    time.sleep(0.01)
    second = answers(handler, loaded)
    assert {version for version, _ in second} == {"m@v2"}
    reference = GenerateHandler(str(versions["v1"].parent), str(versions["v2"]), max_new_tokens=4,
                                model_version="m@v2")
    assert second == answers(reference, reference.load_model())  # the v2 weights answer, not v1's
    assert second != first

    write_pointer(pointers, "m@bad", versions["bad"])
    time.sleep(0.01)
    with caplog.at_level(logging.ERROR, logger="gpuflow.llm_inference"):
        third = answers(handler, loaded)
    assert third == second  # still v2, by id and by answer
    assert "model version m@bad failed to load" in caplog.text and "keeping version m@v2" in caplog.text


def test_beams_model_refresh_hands_over_a_pointer_and_an_empty_path_keeps_the_launch_version(versions, tmp_path):
    handler = GenerateHandler(str(versions["v1"].parent), str(versions["v1"]), max_new_tokens=4, model_version="m@v1")
    handler.update_model_path("")  # WatchFilePattern before any pointer newer than the job
    assert handler.load_model().version == "m@v1"
    handler.update_model_path(write_pointer(tmp_path, "m@v2", versions["v2"]))
    assert handler.load_model().version == "m@v2"
    handler.update_model_path(write_pointer(tmp_path, "m@bad", versions["bad"]))
    assert handler.load_model().version == "m@v2"  # the bad one failed: the served one again
