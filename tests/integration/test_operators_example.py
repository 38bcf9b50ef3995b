"""docs/operators.md's team DAG, as written there, run with dag.test() on the local profile: a team's own tasks
around gpuflow's preflight, quota check and GPU check."""

import json
from pathlib import Path

from airflow.utils.state import DagRunState

from tests.helpers import ROOT

DOC = ROOT / "docs" / "operators.md"
MARKER = "<!-- example-dag -->"
LOCAL_BUNDLE = "airflow.dag_processing.bundles.local.LocalDagBundle"


def example_dag_source() -> str:
    text = DOC.read_text()
    block = text.split(MARKER, 1)[1].split("```python\n", 1)[1]
    return block.split("```", 1)[0]


def test_the_team_dag_in_the_docs_runs_with_gpuflows_operators(airflow_db, emulators, tmp_path, monkeypatch):
    try:
        from airflow.dag_processing.dagbag import DagBag
    except ImportError:  # Airflow 3.1 (make test-composer LINE=3.1.8)
        from airflow.models.dagbag import DagBag

    from tests.helpers import local_site_file

    source = example_dag_source()
    # The page's text, unchanged: it reads the deployment's site file, here a site folder that holds the tests'
    # local configuration (its emulators' ports, its state folder) as site/gpuflow.yaml.
    site = tmp_path / "site"
    site.mkdir()
    (site / "gpuflow.yaml").write_text(Path(local_site_file()).read_text())
    monkeypatch.setenv("GPUFLOW_SITE_DIR", str(site))
    dag_file = tmp_path / "team_gpu_readiness.py"
    dag_file.write_text(source)
    # A DAG folder of the team's own, as a second DAG bundle beside gpuflow's: dag.test() runs a DAG that a
    # bundle holds (it syncs that bundle to the database first).
    monkeypatch.setenv("AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST", json.dumps([
        {"name": "dags-folder", "classpath": LOCAL_BUNDLE, "kwargs": {}},
        {"name": "team-dags", "classpath": LOCAL_BUNDLE, "kwargs": {"path": str(tmp_path)}}]))
    bag = DagBag(str(dag_file))
    assert bag.import_errors == {}
    dag = bag.dags["team_gpu_readiness"]

    run = dag.test()
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert run.state == DagRunState.SUCCESS, states
    assert set(states.values()) == {"success"}
    report = run.get_task_instance("readiness_report").xcom_pull(task_ids="readiness_report")
    # This machine: nvidia-smi lists no GPU, and the GPU check ran on the local runner and reported none.
    assert report == {"quota": "nvidia-smi", "gpu_found": False}
    # The team's own budget reached gpuflow's configuration through the preflight's settings.
    config = run.get_task_instance("gpuflow_preflight").xcom_pull(task_ids="gpuflow_preflight")
    assert config["model"]["max_new_tokens"] == 8
