import pytest

from gpuflow.config import load_config
from gpuflow.containers import check_dockerfile, context_digest, recipe_names, render_recipe


@pytest.mark.parametrize(("beam", "python"), [("2.77.0", "3.11"), ("2.50.0", "3.10")])
def test_rendered_recipe_passes_static_checks(tmp_path, beam, python):
    config = load_config(None, overrides=[f"beam_version={beam}", f"python_version={python}"])
    dockerfile = render_recipe(config, tmp_path)
    text = dockerfile.read_text()
    assert f"FROM apache/beam_python{python}_sdk:{beam}" in text
    assert check_dockerfile(dockerfile, config) == []
    assert f"apache-beam[gcp]=={beam}" in (tmp_path / "worker-requirements.txt").read_text()
    assert (tmp_path / "beam_jobs" / "llm_inference.py").exists()


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        (lambda t: t.replace("&& pip check", ""), "pip check"),
        (lambda t: t.replace("/usr/local/nvidia/lib64:", ""), "LD_LIBRARY_PATH"),
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


def test_recipes_are_listed():
    assert "beam_sdk_cuda" in recipe_names()
