"""Cloud Composer: the deploy commands (dry run), and the DAGs working from Composer's bucket layout."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from gpuflow.composer.contents import DATA_FOLDERS, composer_requirements
from tests.helpers import ROOT


def test_composer_requirements_never_replace_composers_airflow_or_beam():
    wanted = composer_requirements()
    assert not [line for line in wanted
                if line.startswith(("apache-airflow", "apache-beam", "torch", "pyspark", "gcp-storage"))]
    assert "google-cloud-artifact-registry==1.23.0" in wanted


def test_composer_gets_ranges_that_accept_a_newer_package_never_pins():
    from gpuflow.composer.contents import composer_ranges

    ranges = composer_ranges(["google-cloud-artifact-registry==1.23.0", "openai==2.54.0"])
    assert ranges == {"google-cloud-artifact-registry": ">=1.23.0,<2", "openai": ">=2.54.0,<3"}


def test_the_merge_keeps_every_package_and_adds_or_raises_only_gpuflows():
    from gpuflow.composer.contents import merged_packages

    current = {"pandas-gbq": "==0.29.0", "openai": "==1.99.0", "google-cloud-quotas": "==0.7.0"}
    plan = merged_packages(current, {"openai": ">=2.54.0,<3", "google-cloud-quotas": ">=0.6.3,<1",
                                     "dockerfile-parse": ">=2.0.1,<3"})
    assert plan.packages == {"pandas-gbq": "==0.29.0", "openai": ">=2.54.0,<3", "google-cloud-quotas": "==0.7.0",
                             "dockerfile-parse": ">=2.0.1,<3"}
    assert plan.added == {"dockerfile-parse": ">=2.0.1,<3"} and set(plan.raised) == {"openai"}
    assert plan.kept == {"google-cloud-quotas": "==0.7.0"}


@pytest.mark.parametrize(("image", "refused"), [
    ("composer-3-airflow-3.3.1-build.0", False), ("composer-3-airflow-3.3.2-build.1", False),
    ("composer-3-airflow-3.1.8-build.0", False), ("composer-3-airflow-3.2.2-build.1", False),
    ("composer-3-airflow-3.1.7-build.11", True), ("composer-2.9.7-airflow-2.10.2", True), ("something-else", True),
])
def test_an_image_below_the_floor_is_refused_with_the_upgrade_command(image, refused):
    from gpuflow.composer.contents import image_too_old

    problem = image_too_old(image)
    assert bool(problem) == refused
    if refused:
        assert "--image-version composer-3-airflow-3.3.1-build.10" in problem
    if image.startswith("composer-2"):  # no in-place upgrade from Composer 2: a new environment, or a migration
        assert "no in-place upgrade" in problem and "gcloud composer environments update" not in problem


def test_only_files_an_earlier_deploy_copied_are_stale():
    from gpuflow.composer.contents import deploy_files, stale_files

    files = deploy_files()
    assert "dags/llm_streaming_inference.py" in files and "plugins/gpuflow/composer/contents.py" in files
    assert "data/configs/local.yaml" in files and not [name for name in files if "__pycache__" in name]
    previous = [*files, "dags/old_gpuflow_dag.py", "data/site/acme.yaml", "dags/acme/gpuflow_site.py"]
    assert stale_files(previous, files) == ["dags/old_gpuflow_dag.py"]


def test_the_dags_load_and_find_their_files_from_composers_layout(tmp_path):
    """dags/ and plugins/ on sys.path, the rest under data/, as Composer mounts its bucket."""
    gcs = tmp_path / "home" / "airflow" / "gcs"
    shutil.copytree(ROOT / "dags", gcs / "dags")
    shutil.copytree(ROOT / "plugins" / "gpuflow", gcs / "plugins" / "gpuflow",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for folder in DATA_FOLDERS:
        shutil.copytree(ROOT / folder, gcs / "data" / folder)
    from gpuflow.sites import SITE_DAG_FILE, site_dag_file_text

    (gcs / "data" / "site").mkdir()  # what deploy-composer --config installs, for two teams
    for team in ("acme", "beta"):
        (gcs / "data" / "site" / f"{team}.yaml").write_text(
            (ROOT / "configs" / "gcp.example.yaml").read_text().replace("my-gcp-project", f"{team}-ml-prod"))
        (gcs / "dags" / team).mkdir()
        (gcs / "dags" / team / SITE_DAG_FILE).write_text(site_dag_file_text(f"site/{team}.yaml"))
    probe = f"""
import json
try:
    from airflow.dag_processing.dagbag import DagBag
except ImportError:  # Airflow 3.1 (make test-composer LINE=3.1.8)
    from airflow.models.dagbag import DagBag
import gpuflow
from gpuflow.configuration.loading import beam_jobs_dir, load_config
from gpuflow.images.containers import RECIPES_DIR, render_recipe
from gpuflow.runs.trigger_form import form_values
bag = DagBag({str(gcs / 'dags')!r})
config = load_config("configs/gcp.example.yaml")
render_recipe(config, __import__("pathlib").Path({str(tmp_path / 'context')!r}))
print(json.dumps({{"package": gpuflow.__file__, "errors": {{k: str(v) for k, v in bag.import_errors.items()}},
                  "dags": sorted(bag.dag_ids), "beam_jobs": str(beam_jobs_dir()), "recipes": str(RECIPES_DIR),
                  "profile": config.profile,
                  "forms": {{dag_id: [dag.gpuflow_form.config_file, *(form_values(dag.gpuflow_form)[key]
                                                                       for key in ("profile", "project")),
                                     sorted(dag.tags)]
                            for dag_id, dag in bag.dags.items()}}}}))
"""
    # Composer's own site folder (data/site), not the tests' ($GPUFLOW_SITE_DIR)
    env = {**{k: v for k, v in os.environ.items() if k != "GPUFLOW_SITE_DIR"},
           "PYTHONPATH": f"{gcs / 'dags'}:{gcs / 'plugins'}"}
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["package"].startswith(str(gcs / "plugins" / "gpuflow"))
    assert found["errors"] == {}
    # Each team's site folder makes its own DAGs, which replace the repository's local ones.
    names = ["gpu_quota_report", "gpuflow_janitor", "llm_batch_inference", "llm_streaming_inference",
             "llm_streaming_teardown"]  # no dataproc section in the example: no dataproc_gpu_batch
    assert found["dags"] == [f"{team}__{name}" for team in ("acme", "beta") for name in names]
    assert (found["beam_jobs"], found["recipes"]) == (str(gcs / "data" / "beam_jobs"), str(gcs / "data" / "docker"))
    assert found["profile"] == "gcp"  # configs/ was found under data/
    assert (tmp_path / "context" / "Dockerfile").exists()
    # Each site's DAGs read its own file (found under data/), and carry its tag.
    for dag_id, (config_file, profile, project, tags) in found["forms"].items():
        team = dag_id.split("__")[0]
        assert (config_file, profile, project) == (f"site/{team}.yaml", "gcp", f"{team}-ml-prod"), dag_id
        assert f"site:{team}" in tags and "gpuflow" in tags


def test_the_makefile_installs_each_tested_line_as_the_catalog_says_and_the_floor_is_the_oldest():
    from gpuflow.catalog import composer_floor, composer_tested_lines, version_tuple

    makefile = (ROOT / "Makefile").read_text()
    lines = composer_tested_lines()
    for line, spec in lines.items():
        pins = " ".join(f"{package}=={version}" for package, version in spec["packages"].items())
        assert f"COMPOSER_PINS_{line} := {pins}\n" in makefile, line
        constraints = re.search(rf"^COMPOSER_CONSTRAINTS_{re.escape(line)} :=[ \t]*(\S*)$", makefile, re.M)
        assert constraints.group(1) == (spec["constraints"] or ""), line
        assert spec["packages"]["apache-airflow"] == line
    oldest = min(lines, key=version_tuple)
    assert composer_floor()["packages"] == lines[oldest]["packages"]


def test_ci_runs_the_floor_line_from_constraints_a_clone_has():
    """A clone is enough: every constraints file a tested line names is in the repository, with its source; and CI
    runs make test, then the floor line."""
    from gpuflow.catalog import composer_tested_lines, version_tuple

    lines = composer_tested_lines()
    for spec in lines.values():
        if spec["constraints"]:
            path = ROOT / spec["constraints"]
            assert path.is_file() and not path.is_relative_to(ROOT.parent / "shared"), path
            assert path.name in (path.parent / "README.md").read_text(), "the README names its source"
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    steps = [line for line in ci if line.startswith("make ")]
    assert steps == ["make test", f"make test-composer LINE={min(lines, key=version_tuple)}"]


@pytest.mark.parametrize("syntax", ["glob", "regexp"])
def test_airflows_plugin_loader_imports_no_gpuflow_module_from_the_deployed_tree(tmp_path, syntax):
    """Airflow's plugin loader imports each .py under plugins/ as a top-level module named after its file. On the tree
    deploy-composer copies, plugins/gpuflow/.airflowignore keeps every gpuflow module out, in either ignore syntax."""
    from tests.composer_tree import lay_out

    tree = lay_out(tmp_path / "gcs")
    probe = """
import json, sys
from airflow import plugins_manager
before = set(sys.modules)
(plugins_manager._get_plugins if hasattr(plugins_manager, "_get_plugins") else plugins_manager.ensure_plugins_loaded)()
print(json.dumps(sorted(name for name in set(sys.modules) - before
                        if "/plugins/gpuflow/" in (getattr(sys.modules[name], "__file__", None) or ""))))
"""
    env = {**{k: v for k, v in os.environ.items() if k != "GPUFLOW_SITE_DIR"},
           "AIRFLOW__CORE__PLUGINS_FOLDER": str(tree / "plugins"), "AIRFLOW__CORE__DAG_IGNORE_FILE_SYNTAX": syntax,
           "PYTHONPATH": f"{tree / 'dags'}:{tree / 'plugins'}"}
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert [name for name in loaded if not name.startswith("gpuflow")] == [], loaded


def test_no_make_target_and_no_docs_build_touches_the_site_folder():
    """site/ holds the deployment's configuration files (gpuflow.paths.site_dir): the docs site is built elsewhere,
    and `make clean` leaves it alone."""
    site_dir = re.search(r"^site_dir:\s*(\S+)", (ROOT / "mkdocs.yml").read_text(), re.M).group(1)
    assert site_dir.split("/")[0] != "site", site_dir
    makefile = (ROOT / "Makefile").read_text()
    assert not re.search(r"rm -rf[^\n]*\ssite(\s|$)", makefile)
