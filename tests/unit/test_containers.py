import pytest

from gpuflow.config import load_config
from gpuflow.containers import check_dockerfile, context_digest, recipe_metadata, recipe_names, render_recipe

RECIPES = ["beam_sdk_cuda", "cuda_base", "l4", "pytorch_gpu", "vllm"]
VERSION_SETS = [("2.77.0", "3.11"), ("2.52.0", "3.10")]


def test_the_guides_three_ways_and_the_l4_recipe_exist():
    assert recipe_names() == RECIPES


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize(("beam", "python"), VERSION_SETS)
def test_every_recipe_renders_and_passes_static_checks(tmp_path, recipe, beam, python):
    from dockerfile_parse import DockerfileParser

    config = load_config(None, overrides=[f"beam_version={beam}", f"python_version={python}", f"container.recipe={recipe}"])
    dockerfile = render_recipe(config, tmp_path)
    assert check_dockerfile(dockerfile, config) == []
    parsed = DockerfileParser(path=str(dockerfile))
    beam_image = f"apache/beam_python{python}_sdk:{beam}"
    instructions = parsed.structure
    assert parsed.baseimage == beam_image or any(
        i["instruction"] == "COPY" and i["value"].startswith(f"--from={beam_image} /opt/apache/beam /opt/apache/beam")
        for i in instructions
    )
    entrypoints = [i["value"] for i in instructions if i["instruction"] == "ENTRYPOINT"]
    assert entrypoints == ['["/opt/apache/beam/boot"]']
    assert "/usr/local/nvidia/lib64" in parsed.envs["LD_LIBRARY_PATH"]
    assert any("pip check" in i["value"] for i in instructions if i["instruction"] == "RUN")
    requirements = (tmp_path / "worker-requirements.txt").read_text()
    assert f"apache-beam[gcp]=={beam}" in requirements
    assert ("torch==" in requirements) == (recipe_metadata(recipe).torch_from == "pip")
    assert "${" not in dockerfile.read_text().replace("${PATH}", "")
    assert (tmp_path / "beam_jobs" / "llm_inference.py").exists()


def test_the_vllm_recipe_pins_a_vllm_that_matches_its_torch_and_cuda(tmp_path):
    config = load_config(None, overrides=["container.recipe=vllm"])
    render_recipe(config, tmp_path)
    requirements = (tmp_path / "worker-requirements.txt").read_text().splitlines()
    # vllm 0.32.0's wheel requires torch==2.13.0 and transformers>=5.16.1,<5.20.0, and brings CUDA 13 libraries
    assert {"vllm==0.32.0", "torch==2.13.0", "transformers==5.19.0"} <= set(requirements)
    assert recipe_metadata("vllm").cuda_major == 13


def test_recipe_metadata_header():
    assert recipe_metadata("l4").min_beam == "2.50.0"
    assert recipe_metadata("l4").cuda_major == 12
    assert recipe_metadata("pytorch_gpu").torch_from == "image"


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        (lambda t: t.replace("&& pip check", ""), "pip check"),
        (lambda t: t.replace("/usr/local/nvidia/lib64:", ""), "LD_LIBRARY_PATH"),
        (lambda t: t.replace("ENV PYTHONPATH=/opt/gpuflow/beam_jobs", ""), "PYTHONPATH"),
        (lambda t: t + "\nRUN apt-get install -y nvidia-driver-535\n", "installs a GPU driver"),
        (lambda t: t.replace('ENTRYPOINT ["/opt/apache/beam/boot"]', 'ENTRYPOINT ["python"]'), "entrypoint"),
        (lambda t: t.replace("FROM apache/beam_python3.11_sdk:2.77.0", "FROM python:3.11"), "/opt/apache/beam"),
    ],
)
def test_static_check_catches_each_broken_property(tmp_path, mutate, problem):
    config = load_config(None)
    dockerfile = render_recipe(config, tmp_path)
    dockerfile.write_text(mutate(dockerfile.read_text()))
    assert any(problem in found for found in check_dockerfile(dockerfile, config))


def test_context_digest_changes_with_content(tmp_path):
    config = load_config(None)
    render_recipe(config, tmp_path)
    before = context_digest(tmp_path)
    assert before == context_digest(tmp_path)
    (tmp_path / "worker-requirements.txt").write_text("torch==0\n")
    assert context_digest(tmp_path) != before


