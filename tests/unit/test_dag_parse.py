"""DAG files parse cleanly and cheaply: no torch, Beam, transformers or Vertex SDK at parse time."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ["torch", "apache_beam", "transformers", "google.cloud.aiplatform"]


def test_dagbag_loads_without_import_errors():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(str(ROOT / "dags"))
    assert bag.import_errors == {}
    dag = bag.dags["llm_streaming_inference"]
    assert [t.task_id for t in dag.topological_sort()] == [
        "preflight", "check_quota", "setup", "export_model", "build_container", "verify_gpu", "launch", "smoke_test", "cleanup",
    ]
    assert dag.get_task("cleanup").is_teardown
    assert dag.get_task("setup").is_setup and dag.get_task("launch").is_setup
    assert "model__max_new_tokens" in dag.params


def test_importing_a_dag_file_pulls_in_no_heavy_module():
    for dag_file in sorted((ROOT / "dags").glob("*.py")):
        code = (
            "import json, runpy, sys; "
            f"runpy.run_path({str(dag_file)!r}); "
            f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
        )
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        assert json.loads(result.stdout.strip().splitlines()[-1]) == [], dag_file.name
