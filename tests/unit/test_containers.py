"""The recipes render into build contexts that install their lock, hash-checked, and nothing else."""

import pytest

from gpuflow.configuration.loading import load_config
from gpuflow.configuration.model import ConfigError
from gpuflow.images.containers import (
    LOCK_IN_CONTEXT,
    check_dockerfile,
    context_digest,
    recipe_lock,
    recipe_metadata,
    recipe_names,
    render_recipe,
)
from gpuflow.images.locks import lock_path
from tests.gcp_fakes import gcp_test_config

RECIPES = ["beam_sdk_cuda", "cpu", "cuda_base", "l4", "vllm"]


def test_the_guides_three_ways_the_l4_vllm_and_cpu_recipes_exist():
    # pytorch_gpu is gone: its base image's torch 2.5.1 is below transformers 5.24's floor (2.6), and its
    # Python was fixed at 3.11 whatever python_version said.
    assert recipe_names() == RECIPES


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_renders_its_lock_and_passes_static_checks(tmp_path, recipe):
    from dockerfile_parse import DockerfileParser

    config = load_config(None, overrides=[f"container.recipe={recipe}"])
    dockerfile = render_recipe(config, tmp_path)
    assert check_dockerfile(dockerfile, config) == []
    parsed = DockerfileParser(path=str(dockerfile))
    beam_image = "apache/beam_python3.11_sdk:2.77.0"
    instructions = parsed.structure
    assert parsed.baseimage == beam_image or any(
        i["instruction"] == "COPY" and i["value"].startswith(f"--from={beam_image} /opt/apache/beam /opt/apache/beam")
        for i in instructions
    )
    assert [i["value"] for i in instructions if i["instruction"] == "ENTRYPOINT"] == ['["/opt/apache/beam/boot"]']
    if recipe_metadata(recipe).cuda_major is not None:
        assert "/usr/local/nvidia/lib64" in parsed.envs["LD_LIBRARY_PATH"]
    assert (tmp_path / LOCK_IN_CONTEXT).read_text() == lock_path(recipe_lock(recipe).name).read_text()
    assert "${" not in dockerfile.read_text().replace("${PATH}", "")
    assert (tmp_path / "beam_jobs" / "llm_inference.py").exists()


def test_a_lock_for_another_python_or_beam_is_refused_before_rendering(tmp_path):
    for override, fix in (("python_version=3.12", "make lock PYTHON_VERSION=3.12"),
                          ("beam_version=2.52.0", "make lock BEAM_VERSION=2.52.0")):
        with pytest.raises(ConfigError, match=fix.replace(".", r"\.")):
            render_recipe(load_config(None, overrides=[override]), tmp_path)


def test_the_recipe_follows_the_gpu_and_the_engine_unless_named():
    assert load_config(None).recipe == "l4"
    assert load_config(None, overrides=["gpu.type=none"]).recipe == "cpu"
    assert load_config(None, overrides=["inference.engine=vllm"]).recipe == "vllm"
    assert load_config(None, overrides=["gpu.type=none", "container.recipe=l4"]).recipe == "l4"


def test_recipe_metadata_header():
    assert recipe_metadata("l4").min_beam == "2.50.0"
    assert (recipe_metadata("l4").cuda_major, recipe_metadata("l4").lock) == (12, "cuda12")
    assert (recipe_metadata("cpu").cuda_major, recipe_metadata("cpu").lock) == (None, "cpu")
    assert recipe_metadata("vllm").also_cuda == (12,)


# The l4 recipe as it was: `pip install --upgrade pip` and an unhashed requirements file.
OLD_L4_INSTALL = ("RUN pip install --upgrade pip \\\n    && pip install -r /tmp/worker-requirements.txt \\\n"
                  "    && pip check\n")


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        (lambda t: t.replace("\n    && pip check", ""), "pip check"),
        (lambda t: t.replace("/usr/local/nvidia/lib64:", ""), "LD_LIBRARY_PATH"),
        (lambda t: t.replace("ENV PYTHONPATH=/opt/gpuflow/beam_jobs", ""), "PYTHONPATH"),
        (lambda t: t + "\nRUN apt-get install -y nvidia-driver-535\n", "installs a GPU driver"),
        (lambda t: t.replace('ENTRYPOINT ["/opt/apache/beam/boot"]', 'ENTRYPOINT ["python"]'), "entrypoint"),
        (lambda t: t.replace("FROM apache/beam_python3.11_sdk:2.77.0", "FROM python:3.11"), "/opt/apache/beam"),
        (lambda t: t[:t.index("RUN pip install")] + OLD_L4_INSTALL + t[t.index("\nCOPY beam_jobs"):],
         "with pip --require-hashes"),
        (lambda t: t[:t.index("RUN pip install")] + OLD_L4_INSTALL + t[t.index("\nCOPY beam_jobs"):],
         "installs what no lock pins: `pip install --upgrade pip`"),
        (lambda t: t + "\nRUN pip install --no-cache-dir sentencepiece\n", "installs what no lock pins"),
        (lambda t: t.replace("sdk:2.77.0", "sdk:latest"), "not pinned to a tag"),
        (lambda t: t.replace("sdk:2.77.0", "sdk"), "not pinned to a tag"),
        (lambda t: t.replace("not their digests", "nothing"), "does not say why"),
    ],
)
def test_static_check_catches_each_broken_property(tmp_path, mutate, problem):
    config = load_config(None)
    dockerfile = render_recipe(config, tmp_path)
    dockerfile.write_text(mutate(dockerfile.read_text()))
    assert any(problem in found for found in check_dockerfile(dockerfile, config)), check_dockerfile(dockerfile, config)


def test_the_flex_launcher_is_pinned_to_the_configured_tag_never_latest(tmp_path):
    from gpuflow.images.containers import FLEX_LAUNCHER, flex_launcher_problem

    problem, _ = flex_launcher_problem(gcp_test_config("python_version=3.13"))
    assert "container.flex_launcher_tag is empty and catalog/images.yaml pins none for Python 3.13" in problem
    pinned = render_recipe(gcp_test_config(), tmp_path / "pinned").read_text()  # gcp's default mode, the catalog's tag
    assert (f"COPY --from=gcr.io/dataflow-templates-base/python311-template-launcher-base:20240812-rc01 "
            f"{FLEX_LAUNCHER} {FLEX_LAUNCHER}") in pinned
    with pytest.raises(ConfigError, match="is latest"):
        render_recipe(gcp_test_config("launch.mode=flex_template", "container.flex_launcher_tag=latest"), tmp_path)
    flex = gcp_test_config("launch.mode=flex_template", "container.flex_launcher_tag=20260101_RC00")
    text = render_recipe(flex, tmp_path / "b").read_text()
    assert (f"COPY --from=gcr.io/dataflow-templates-base/python311-template-launcher-base:20260101_RC00 "
            f"{FLEX_LAUNCHER} {FLEX_LAUNCHER}") in text


def test_context_digest_changes_with_content(tmp_path):
    config = load_config(None)
    render_recipe(config, tmp_path)
    before = context_digest(tmp_path)
    assert before == context_digest(tmp_path)
    (tmp_path / LOCK_IN_CONTEXT).write_text("torch==0\n")
    assert context_digest(tmp_path) != before


def test_an_image_named_in_the_configuration_is_used_as_it_is_and_no_recipe_is_rendered(tmp_path):
    from gpuflow.runs.naming import resource_names
    from gpuflow.steps.container import build_container

    # python_version 3.12 has no lock: rendering would refuse it; the named image needs none.
    config = load_config(None, overrides=["container.image=acme/worker:7", "python_version=3.12"])
    result = build_container(config, resource_names(config, "gf-image00001"), platform=None, work_dir=tmp_path)
    assert (result["image"], result["built"], list(tmp_path.iterdir())) == ("acme/worker:7", False, [])
