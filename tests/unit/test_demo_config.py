"""`make demo` runs the repository's own local DAGs, whatever site folders (dags/<site>/) a deployment has written
into the checkout's dags/: those replace the local DAGs in the folder that holds them (gpuflow.sites)."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT, dag_bag

pytestmark = pytest.mark.timeout(120)


def demo_environment() -> dict[str, str]:
    """The variables `make demo` exports, read from what make would run (make -n)."""
    shown = subprocess.run(["make", "-n", "demo"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    exported = shown[shown.index("export AIRFLOW_HOME="):].replace("\\\n", " ").split(";")[0]
    words = exported.split()[1:]
    return dict(word.split("=", 1) for word in words if "=" in word)


def demo_links() -> list[str]:
    """The link commands `make demo` runs to lay out its DAG folder."""
    shown = subprocess.run(["make", "-n", "demo"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [line for line in shown.splitlines() if line.startswith("ln ")]


def test_make_demo_runs_the_local_dags_with_a_site_folder_in_the_checkouts_dags(tmp_path):
    from gpuflow.sites import write_site_dag_file
    from tests.helpers import site_config

    checkout = tmp_path / "checkout-dags"  # a copy: the repository's dags/ is other tests' too
    checkout.mkdir()
    for dag_file in ROOT.joinpath("dags").glob("*.py"):
        shutil.copy2(dag_file, checkout / dag_file.name)
    write_site_dag_file(Path(site_config("acme.yaml")), checkout)
    assert sorted(dag_bag(checkout).dags) == sorted(f"acme__{name}" for name in (
        "gpu_quota_report", "gpuflow_janitor", "llm_batch_inference", "llm_streaming_inference",
        "llm_streaming_teardown"))  # the site's DAGs replace the local ones (its file has no dataproc section)

    demo_folder = Path(demo_environment()["AIRFLOW__CORE__DAGS_FOLDER"])
    assert demo_folder != ROOT / "dags"
    (link,) = demo_links()
    demo = tmp_path / "demo-dags"
    demo.mkdir()
    command = link.replace(str(ROOT / "dags"), str(checkout)).replace(str(demo_folder), str(demo))
    subprocess.run(command, shell=True, check=True, env=os.environ)
    assert "llm_streaming_inference" in dag_bag(demo).dags
    assert dag_bag(demo).dags["llm_streaming_inference"].gpuflow_form.config_file == "configs/local.yaml"
