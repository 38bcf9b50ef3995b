"""DAG files parse cleanly and cheaply: nothing beyond what a one-task DAG loads, except gpuflow's own light modules."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import dag_bag

ROOT = Path(__file__).resolve().parents[2]
DAG_FILES = sorted((ROOT / "dags").glob("*.py"))
HEAVY = ("torch", "apache_beam", "transformers", "google.cloud", "vertexai", "airflow.providers", "pydantic_core")

ONE_TASK_DAG = """
import pendulum
from airflow.sdk import DAG
from airflow.providers.standard.operators.empty import EmptyOperator

with DAG(dag_id="one_task", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False):
    EmptyOperator(task_id="only")
"""


def test_dagbag_loads_without_import_errors():
    bag = dag_bag()
    assert bag.import_errors == {}
    dag = bag.dags["llm_streaming_inference"]
    assert [t.task_id for t in dag.topological_sort()] == [
        "preflight", "check_quota", "setup", "export_model", "build_container", "verify_gpu", "launch", "smoke_test",
        "promote", "cleanup",
    ]
    assert dag.get_task("cleanup").is_teardown
    assert dag.get_task("setup").is_setup and dag.get_task("launch").is_setup
    assert "model__max_new_tokens" in dag.params
    # The form lives on the DAG alone (attached after the tasks), so parsing does not copy it into each task.
    assert all(not task.params for task in dag.tasks)
    # The tasks that start GPU jobs share the gpuflow_gpu pool, in every DAG; the others use the default pool.
    in_pool = {(dag_id, task.task_id) for dag_id, one in bag.dags.items() for task in one.tasks
               if task.pool == "gpuflow_gpu"}
    assert in_pool == {("llm_streaming_inference", "verify_gpu"), ("llm_streaming_inference", "launch"),
                       ("llm_batch_inference", "verify_gpu"), ("llm_batch_inference", "run_batch"),
                       ("dataproc_gpu_batch", "batch")}
    batch = bag.dags["llm_batch_inference"]
    assert [t.task_id for t in batch.topological_sort()] == [
        "preflight", "wait_for_input", "check_quota", "setup", "export_model", "build_container", "verify_gpu",
        "run_batch", "publish", "check_gpu_usage", "cleanup"]
    assert batch.get_task("cleanup").is_teardown and batch.get_task("run_batch").is_setup
    assert {"batch__input", "batch__output", "batch__missing_input"} <= set(batch.params)
    assert {"deployment__mode", "deployment__name", "deployment__rollout_timeout_s"} <= set(dag.params)
    assert [t.task_id for t in bag.dags["llm_streaming_teardown"].topological_sort()] == ["preflight", "teardown"]
    janitor = bag.dags["gpuflow_janitor"]
    assert [t.task_id for t in janitor.topological_sort()] == ["preflight", "janitor"]
    assert {"deployment__name"} <= set(bag.dags["llm_streaming_teardown"].params)
    assert {"janitor__dry_run", "dataflow__stop_action"} <= set(janitor.params)
    assert {"batch__schedule", "batch__catchup"}.isdisjoint(batch.params)  # the DAG's own, read when parsed
    # (Airflow 3.3's SDK timetable says its cron as .expression, 3.1's as .summary)
    cron = getattr(batch.timetable, "expression", None) or batch.timetable.summary
    assert cron == "0 0 * * *" and batch.catchup is False  # @daily
    assert type(batch.timetable).__name__ == "CronDataIntervalTimetable"  # ds: the day that has just ended


def modules_loaded_by_parsing(path: Path) -> set[str]:
    """The modules that executing a DAG file adds to an interpreter that has imported Airflow's SDK (as the
    DAG processor has)."""
    code = (
        "import json, runpy, sys; import airflow.sdk, pendulum; before = set(sys.modules); "
        f"runpy.run_path({str(path)!r}); print(json.dumps(sorted(set(sys.modules) - before)))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(json.loads(result.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("dag_file", DAG_FILES, ids=lambda path: path.name)
def test_parsing_a_dag_file_pulls_in_no_provider_or_heavy_module(dag_file, tmp_path):
    """An Asset URI scheme once made each parse load every provider (~32x a one-task DAG): caught here."""
    baseline = tmp_path / "one_task.py"
    baseline.write_text(ONE_TASK_DAG)
    extra = modules_loaded_by_parsing(dag_file) - modules_loaded_by_parsing(baseline)
    heavy = sorted(name for name in extra if name.startswith(HEAVY))
    assert heavy == [], f"{dag_file.name} pulls in {heavy[:10]}"
    assert all(name.startswith(("gpuflow", "airflow.sdk.")) for name in extra), sorted(extra)
