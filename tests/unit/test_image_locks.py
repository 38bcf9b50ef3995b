"""Each lock, read back, agrees with its recipe's label and with the image it is installed in."""

import re
from importlib import metadata
from pathlib import Path

import pytest

from gpuflow import catalog
from gpuflow.images.containers import EXPORT_LOCK, recipe_lock, recipe_metadata, recipe_names, recipe_table
from gpuflow.images.locks import Lock, lock_path, lock_problems, parse_lock, read_lock, transformers_problems


@pytest.mark.parametrize("recipe", ["beam_sdk_cuda", "cpu", "cuda_base", "l4", "vllm"])
def test_every_recipe_lock_agrees_with_the_recipes_label(recipe):
    meta = recipe_metadata(recipe)
    lock = recipe_lock(recipe)
    assert lock_problems(lock, meta.cuda_major, also_cuda=meta.also_cuda) == []
    assert (lock.python, lock.beam) == ("3.11", "2.77.0")


def test_the_cuda_12_recipes_install_torchs_cuda_12_build_and_no_cuda_13_library():
    lock = recipe_lock("l4")
    assert lock.torch == "2.10.0" and lock.cuda_line == 12 and lock.cuda_lines_pulled == {12}
    assert lock.packages["nvidia-cuda-runtime-cu12"].startswith("12.")
    assert lock.driver_need == 525  # NVIDIA's minor version compatibility: CUDA 12.x on >= 525, guide 003's L4 floor


def test_the_old_l4_resolution_torch_2_13_from_pypi_is_refused_under_a_cuda_12_label():
    """What `torch==2.13.0` from PyPI resolved to for the old l4 recipe: CUDA 13 runtime libraries."""
    vllm = recipe_lock("vllm")  # the same torch 2.13.0 wheel, with what it pulls
    cuda13 = {name: version for name, version in vllm.packages.items() if name.startswith("nvidia-cu")}
    old_l4 = Lock("l4-old", "3.11", None, {"torch": "2.13.0", "transformers": "5.24.0", **cuda13})
    problems = lock_problems(old_l4, 12)
    assert any("torch 2.13.0 is built for CUDA 13, yet its recipe is labelled CUDA 12" in p for p in problems)
    assert old_l4.driver_need == 580


def test_the_vllm_lock_needs_a_cuda_13_driver_and_says_which_cuda_12_libraries_it_also_carries():
    lock = recipe_lock("vllm")
    assert (lock.torch, lock.cuda_line, lock.driver_need) == ("2.13.0", 13, 580)
    assert lock.cuda_lines_pulled == {12, 13}
    assert any("CUDA [12]" in p for p in lock_problems(lock, 13))  # not admitted without also_cuda=12
    assert lock_problems(lock, 13, also_cuda=(12,)) == []


def test_the_cpu_lock_holds_torchs_cpu_build_and_no_nvidia_library():
    lock = recipe_lock("cpu")
    assert lock.torch.endswith("+cpu") and lock.cuda_line is None and lock.driver_need is None
    assert not [name for name in lock.packages if name.startswith("nvidia")]
    assert any("labelled CPU" in p for p in lock_problems(recipe_lock("l4"), None))


def test_transformers_refuses_a_torch_below_its_floor_that_pip_check_lets_through():
    five = Lock("x", "3.11", None, {"transformers": "5.24.0"})
    assert transformers_problems(five, image_torch="2.4")  # the old export: transformers 5.x in pytorch-cpu.2-4
    assert transformers_problems(five, image_torch="2.5.1")  # the old pytorch_gpu recipe's image
    assert transformers_problems(five, image_torch="2.6") == []
    unknown = Lock("x", "3.11", None, {"transformers": "9.9.9", "torch": "2.13.0"})
    assert "not in catalog/images.yaml" in transformers_problems(unknown)[0]


def test_the_export_lock_loads_models_on_the_export_images_own_torch_and_python():
    from gpuflow.configuration.loading import load_config

    image = load_config(None).export.container_image
    torch, python = catalog.export_image_versions(image)
    assert (torch, python) == ("2.4", "3.10")
    lock = read_lock(EXPORT_LOCK)
    assert lock.python == python and "torch" not in lock.packages
    assert lock_problems(lock, None, image_torch=torch) == []


def test_the_catalogs_floor_for_the_installed_transformers_is_what_its_source_says():
    source = Path(__import__("transformers").utils.import_utils.__file__).read_text()
    floor = re.search(r"Disabling PyTorch because PyTorch >= ([\d.]+) is required", source)[1]
    assert catalog.transformers_torch_floor(metadata.version("transformers")) == floor


def test_a_lock_without_hashes_or_older_than_its_input_is_refused():
    text = lock_path("cuda12").read_text()
    unhashed = re.sub(r"(?m)^(safetensors==[^\n]*?) \\\n(    --hash=[^\n]*\n)+", r"\1\n", text)
    assert "pins without a hash: safetensors" in " ".join(lock_problems(parse_lock("cuda12", unhashed), 12))
    stale = text.replace("transformers==5.24.0", "transformers==5.23.0")
    assert any("older than cuda12.in" in p for p in lock_problems(parse_lock("cuda12", stale), 12))
    export = lock_path(EXPORT_LOCK).read_text().replace("transformers==4.57.6", "transformers==4.57.5")
    assert any("older than export.in" in p for p in lock_problems(parse_lock(EXPORT_LOCK, export), None))


def test_the_recipe_table_has_a_row_per_recipe():
    assert len(recipe_table().splitlines()) == len(recipe_names()) + 2


def test_download_models_own_vertex_mode_installs_the_export_locks_pins():
    import download_model
    from gpuflow.images.locks import input_pins

    assert {p.split("==")[0]: p.split("==")[1] for p in download_model.VERTEX_REQUIREMENTS} == input_pins("export", "")
    assert catalog.export_image_versions(download_model.VERTEX_CONTAINER) == ("2.4", "3.10")
