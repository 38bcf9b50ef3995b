"""Cloud Composer: the deploy commands (dry run), and the DAGs working from Composer's bucket layout."""

import json
import os
import shutil
import subprocess
import sys

from gpuflow.composer import DATA_FOLDERS, composer_requirements
from tests.helpers import ROOT


def test_make_deploy_composer_dry_run_prints_the_gcloud_commands_and_runs_none(tmp_path):
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    (tmp_path / "gcloud").write_text("#!/bin/sh\necho gcloud must not run in a dry run >&2; exit 3\n")
    (tmp_path / "gcloud").chmod(0o755)
    result = subprocess.run(
        [sys.executable, "-m", "gpuflow.cli", "deploy-composer", "--environment", "gpuflow-prod",
         "--location", "europe-west4", "--requirements-file", str(tmp_path / "req.txt"), "--dry-run"],
        capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    commands = [line for line in result.stdout.splitlines() if line.startswith("gcloud ")]
    where = "--environment=gpuflow-prod --location=europe-west4"
    dag_files = sorted(p.name for p in (ROOT / "dags").glob("*.py"))
    assert commands == [
        *(f"gcloud composer environments storage dags import {where} --source={ROOT}/dags/{name}" for name in dag_files),
        f"gcloud composer environments storage plugins import {where} --source={ROOT}/plugins/gpuflow",
        *(f"gcloud composer environments storage data import {where} --source={ROOT}/{folder}"
          for folder in DATA_FOLDERS),
        "gcloud composer environments update gpuflow-prod --location=europe-west4 "
        f"--update-pypi-packages-from-file={tmp_path}/req.txt",
    ]
    assert (tmp_path / "req.txt").read_text().splitlines() == composer_requirements()


def test_composer_requirements_never_replace_composers_airflow_or_beam():
    wanted = composer_requirements()
    assert not [line for line in wanted
                if line.startswith(("apache-airflow", "apache-beam", "torch", "pyspark", "gcp-storage"))]
    assert "google-cloud-artifact-registry==1.23.0" in wanted


def test_the_dags_load_and_find_their_files_from_composers_layout(tmp_path):
    """dags/ and plugins/ on sys.path, the rest under data/, as Composer mounts its bucket."""
    gcs = tmp_path / "home" / "airflow" / "gcs"
    shutil.copytree(ROOT / "dags", gcs / "dags")
    shutil.copytree(ROOT / "plugins" / "gpuflow", gcs / "plugins" / "gpuflow",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for folder in DATA_FOLDERS:
        shutil.copytree(ROOT / folder, gcs / "data" / folder)
    probe = f"""
import json
from airflow.dag_processing.dagbag import DagBag
import gpuflow
from gpuflow.config_loading import beam_jobs_dir, load_config
from gpuflow.containers import RECIPES_DIR, render_recipe
bag = DagBag({str(gcs / 'dags')!r})
config = load_config("configs/gcp.example.yaml")
render_recipe(config, __import__("pathlib").Path({str(tmp_path / 'context')!r}))
print(json.dumps({{"package": gpuflow.__file__, "errors": {{k: str(v) for k, v in bag.import_errors.items()}},
                  "dags": sorted(bag.dag_ids), "beam_jobs": str(beam_jobs_dir()), "recipes": str(RECIPES_DIR),
                  "profile": config.profile}}))
"""
    env = {**os.environ, "PYTHONPATH": f"{gcs / 'dags'}:{gcs / 'plugins'}"}
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["package"].startswith(str(gcs / "plugins" / "gpuflow"))
    assert found["errors"] == {}
    assert found["dags"] == ["dataproc_gpu_batch", "gpu_quota_report", "gpuflow_janitor", "llm_batch_inference",
                             "llm_streaming_inference", "llm_streaming_teardown"]
    assert (found["beam_jobs"], found["recipes"]) == (str(gcs / "data" / "beam_jobs"), str(gcs / "data" / "docker"))
    assert found["profile"] == "gcp"  # configs/ was found under data/
    assert (tmp_path / "context" / "Dockerfile").exists()
