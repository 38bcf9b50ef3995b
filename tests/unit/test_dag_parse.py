"""DAG files parse cleanly, as the dag-processor parses, and without the tasks' heavy libraries. How long a parse
takes against a one-task DAG is a benchmark's (benchmarks/dag_parse.py, its bound 2.5), not a timed test's."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import dag_bag

ROOT = Path(__file__).resolve().parents[2]
DAG_FILES = sorted((ROOT / "dags").glob("*.py"))
#: What a parse never loads: the tasks' own libraries.
HEAVY = ("torch", "apache_beam", "transformers", "vertexai")

def test_dagbag_loads_without_import_errors():
    bag = dag_bag()
    assert bag.import_errors == {}
    dag = bag.dags["llm_streaming_inference"]
    assert [t.task_id for t in dag.topological_sort()] == [
        "preflight", "check_quota", "setup", "export_model", "build_container", "verify_gpu", "evaluate", "launch",
        "smoke_test", "promote", "cleanup",
    ]
    assert dag.get_task("cleanup").is_teardown
    assert dag.get_task("setup").is_setup and dag.get_task("launch").is_setup
    assert "model__max_new_tokens" in dag.params
    # The form lives on the DAG alone (attached after the tasks), so parsing does not copy it into each task.
    assert all(not task.params for task in dag.tasks)
    # The tasks that start GPU jobs share the gpuflow_gpu pool, in every DAG; the others use the default pool.
    in_pool = {(dag_id, task.task_id) for dag_id, one in bag.dags.items() for task in one.tasks
               if task.pool == "gpuflow_gpu"}
    assert in_pool == {("llm_streaming_inference", "verify_gpu"), ("llm_streaming_inference", "evaluate"),
                       ("llm_streaming_inference", "launch"), ("llm_batch_inference", "verify_gpu"), ("llm_batch_inference", "run_batch"),
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


#: One process as the dag-processor is: Airflow loaded, each file's ``airflow.*`` imports done before the fork
#: (``[dag_processor] parsing_pre_import_modules``, on by default; Airflow's own ``iter_airflow_imports``), then
#: each file parsed in a forked child. A child reports its parse's seconds and the modules the parse imported.
FORKED_PARSES = """
import importlib, json, os, runpy, sys, time
import airflow.sdk, pendulum
from airflow.utils.file import iter_airflow_imports
paths = {paths!r}
for path in paths:
    for module in iter_airflow_imports(path):
        importlib.import_module(module)
measured = {{}}
for path in paths:
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        before = set(sys.modules)
        started = time.perf_counter()
        runpy.run_path(path)
        seconds = time.perf_counter() - started
        os.write(write, json.dumps([seconds, sorted(set(sys.modules) - before)]).encode())
        os._exit(0)
    os.close(write)
    answer = b""
    while chunk := os.read(read, 65536):
        answer += chunk
    os.close(read)
    os.waitpid(child, 0)
    measured[path] = json.loads(answer)
print(json.dumps(measured))
"""


@pytest.fixture(scope="module")  # one parse each: what a parse imports does not vary
def forked_parses() -> dict[str, tuple[float, list[str]]]:
    """Each DAG file's forked parse: (seconds, modules the parse imported)."""
    paths = [str(path) for path in DAG_FILES]
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}  # as Airflow runs
    result = subprocess.run([sys.executable, "-c", FORKED_PARSES.format(paths=paths)],
                            capture_output=True, text=True, check=True, env=env, timeout=300)
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("dag_file", DAG_FILES, ids=lambda path: path.name)
def test_no_parse_imports_torch_beam_or_transformers(dag_file, forked_parses):
    """They load in the tasks, never while a DAG file is parsed."""
    _, imported = forked_parses[str(dag_file)]
    heavy = sorted(name for name in imported if name.startswith(HEAVY))
    assert heavy == [], f"{dag_file.name} loads {heavy[:10]} at every parse"
