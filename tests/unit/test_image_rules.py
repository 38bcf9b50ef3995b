"""Preflight's image rules: each fires on what the locks and the configuration say, names the field and the fix."""

import pytest

from gpuflow.configuration.loading import load_config
from gpuflow.images.locks import Lock
from gpuflow.preflight import image_rules, run_preflight
from gpuflow.preflight import rules as rules_module
from tests.gcp_fakes import FLEX, gcp_test_config


def findings_of(config, field=None):
    found = run_preflight(config, check_environment=False)
    return [f for f in found if field is None or f.field == field]


def local(*overrides):
    return load_config(None, overrides=list(overrides))


CASES = [
    # (config, rule, field, level, words in the problem, words in the fix)
    (lambda: local("container.recipe=pytorch_gpu"), "worker_recipe", "container.recipe", "error",
     "'pytorch_gpu' does not exist", "gpuflow recipes"),
    (lambda: local("python_version=3.12"), "worker_recipe", "container.recipe", "error",
     "resolved for Python 3.11", "make lock PYTHON_VERSION=3.12"),
    (lambda: local("beam_version=2.76.0"), "worker_recipe", "container.recipe", "error",
     "pins Beam 2.77.0", "make lock BEAM_VERSION=2.76.0"),
    (lambda: local("gpu.type=none", "gpu.machine_type=n2-highmem-2", "container.recipe=l4"), "worker_recipe",
     "container.recipe", "warning", "CUDA 12 libraries (gigabytes) for nothing", "container.recipe: cpu"),
    (lambda: local("container.recipe=cpu"), "worker_recipe", "container.recipe", "error",
     "torch's CPU build", "CUDA recipe"),
    (lambda: local("beam_version=2.77.0", "container.recipe=vllm"), "worker_recipe", "container.recipe",
     "warning", "needs driver >= 580; nvidia-l4's page asks only for >= 525", "GPU driver"),
    (lambda: gcp_test_config("project=acme-ml-prod", "python_version=3.13"), "worker_recipe",
     "container.flex_launcher_tag", "error", "is empty", "flex-templates-base-images"),
    (lambda: gcp_test_config("project=acme-ml-prod", "export.container_image=us-docker.pkg.dev/x/my-image:1"),
     "export_lock", "export.container_image", "error", "not one of Vertex AI's prebuilt", "pytorch-cpu"),
    (lambda: gcp_test_config("project=acme-ml-prod",
                             "export.container_image=us-docker.pkg.dev/vertex-ai/training/pytorch-cpu.2-4.py311:latest"),
     "export_lock", "export.container_image", "error", "runs Python 3.11", "make lock"),
    # guide 002's own export image: an older name without .pyXY, so its Python is unknown (a warning, not a refusal)
    (lambda: gcp_test_config("project=acme-ml-prod",
                             "export.container_image=us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.1-13:latest"),
     "export_lock", "export.container_image", "warning", "gives no Python", "pytorch-cpu.X-Y.pyXY"),
    (lambda: gcp_test_config("project=acme-ml-prod", "export.pip_packages=['transformers>=4.40']"), "export_lock",
     "export.pip_packages", "warning", "not pinned", "name==version"),
]


@pytest.mark.parametrize(("make_config", "rule", "field", "level", "problem_words", "fix_words"), CASES)
def test_image_rule_fires_with_field_and_fix_and_only_because_of_that_rule(
        make_config, rule, field, level, problem_words, fix_words, monkeypatch):
    config = make_config()

    def matching():
        return [f for f in findings_of(config, field)
                if f.level == level and problem_words in f.problem and fix_words in f.fix]

    assert matching(), findings_of(config, field)
    rule_function = getattr(image_rules, rule)
    monkeypatch.setattr(rules_module, "CONFIG_RULES", [r for r in rules_module.CONFIG_RULES if r is not rule_function])
    assert not matching()


def test_the_old_export_transformers_in_the_torch_2_4_image_is_refused(monkeypatch):
    """The old export installed `transformers>=4.40`: 5.x today, which turns PyTorch off below torch 2.6."""
    old = Lock("export", "3.10", None, {"transformers": "5.24.0", "sentencepiece": "0.2.3"})
    monkeypatch.setattr(image_rules, "read_lock", lambda name: old)
    (found,) = [f for f in findings_of(gcp_test_config("project=acme-ml-prod"), "export.container_image")
                if f.level == "error"]
    assert "turns PyTorch off below torch 2.6, and the image has torch 2.4" in found.problem


def test_the_default_recipes_pass_on_gpu_cpu_vllm_and_flex():
    for config in (local(), local("gpu.type=none", "gpu.machine_type=n2-highmem-2"),
                   gcp_test_config("project=acme-ml-prod", *FLEX)):
        assert [f for f in findings_of(config) if f.level == "error" and f.field.startswith(("container", "export"))] \
            == [], config.recipe
    on_gcp = findings_of(gcp_test_config("project=acme-ml-prod"), "container.recipe")
    assert [f.problem for f in on_gcp if f.level == "info"] == [
        "recipe l4's torch is built for CUDA 12: it needs driver >= 525; the driver Dataflow installs depends on its "
        "Container-Optimized OS version (guide 000)"]
