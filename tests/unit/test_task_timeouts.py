"""Every task has an execution_timeout above the waits its configuration bounds, and a run that asks for longer
waits than its tasks allow is refused before anything is created."""

import runpy
from datetime import timedelta

import pytest

from gpuflow.configuration.loading import load_config
from gpuflow.runs.task_timeouts import MARGIN_S, SHORT_S, WAITING_FLOOR_S, config_lookup, timeouts_s, too_short_for
from tests.helpers import ROOT

DAG_FILES = sorted((ROOT / "dags").glob("*.py"))


def parsed(name: str):
    """The DAG a repository DAG file makes, under its id (the file's stem)."""
    return runpy.run_path(str(ROOT / "dags" / name))[name.removesuffix(".py")]


@pytest.mark.parametrize("dag_file", DAG_FILES, ids=lambda path: path.name)
def test_every_task_has_an_execution_timeout(dag_file):
    dag = parsed(dag_file.name)
    assert all(isinstance(task.execution_timeout, timedelta) and task.execution_timeout.total_seconds() >= SHORT_S
               for task in dag.tasks), {task.task_id: task.execution_timeout for task in dag.tasks}


def test_the_waiting_tasks_get_their_configured_waits_plus_a_margin():
    dag = parsed("llm_streaming_inference.py")
    config = load_config("configs/local.yaml")
    assert dag.get_task("export_model").execution_timeout.total_seconds() == config.export.timeout_s + MARGIN_S
    # 30 min start + margin for the placement and two fallbacks a run may add in its form
    assert dag.get_task("launch").execution_timeout.total_seconds() == 3 * (config.dataflow.start_timeout_s + MARGIN_S)
    assert dag.get_task("smoke_test").execution_timeout.total_seconds() == WAITING_FLOOR_S
    assert dag.get_task("preflight").execution_timeout.total_seconds() == SHORT_S


def test_fallbacks_lengthen_the_launch_and_the_cleanup():
    values = load_config("configs/gcp.example.yaml",
                         overrides=["gpu.fallbacks=[{region: us-east4}, {type: nvidia-tesla-t4, machine_type: n1-standard-8}]"])
    one = timeouts_s(config_lookup(load_config("configs/gcp.example.yaml")))
    three = timeouts_s(config_lookup(values))
    assert three["job_start"] == 3 * one["job_start"]
    assert three["every_region_stops"] > one["every_region_stops"]  # two regions to stop jobs in


def test_the_shipped_configurations_fit_their_dags_and_a_longer_wait_is_refused():
    streaming, batch = parsed("llm_streaming_inference.py"), parsed("dataproc_gpu_batch.py")
    assert too_short_for(load_config("configs/gcp.example.yaml"), streaming) == []
    assert too_short_for(load_config("configs/dataproc.example.yaml"), batch) == []
    (refused,) = too_short_for(load_config(None, overrides=["smoke_test.timeout_s=7200"]), streaming)
    assert refused.startswith("smoke_test needs up to 8400s")
    two_fallbacks = "gpu.fallbacks=[{region: us-east4}, {region: us-west1}]"
    assert too_short_for(load_config(None, overrides=[two_fallbacks]), streaming) == []
    three_fallbacks = "gpu.fallbacks=[{region: us-east4}, {region: us-west1}, {region: europe-west4}]"
    assert [line.split()[0] for line in too_short_for(load_config(None, overrides=[three_fallbacks]), streaming)] == [
        "verify_gpu", "launch", "cleanup"]


def test_a_tasks_timeout_follows_its_operator_not_its_id():
    """A task renamed keeps its wait; an operator that declares none cannot go into a DAG, nor a DAG without form."""
    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.sdk import DAG

    from gpuflow.operators.streaming import ExportModelOperator
    from gpuflow.runs.task_timeouts import apply_task_timeouts
    from gpuflow.runs.trigger_form import FormLayout, attach_trigger_form

    form = FormLayout("configs/local.yaml", ("profile",), ())  # the form names the configuration file it reads
    with DAG("any_name", schedule=None) as dag:
        ExportModelOperator(task_id="fetch_weights")
    with pytest.raises(TypeError, match="no gpuflow form"):
        apply_task_timeouts(dag)
    attach_trigger_form(dag, form)
    apply_task_timeouts(dag)
    config = load_config("configs/local.yaml")
    assert dag.get_task("fetch_weights").execution_timeout.total_seconds() == config.export.timeout_s + MARGIN_S
    with DAG("any_name", schedule=None) as dag:
        EmptyOperator(task_id="noop")
    attach_trigger_form(dag, form)
    with pytest.raises(TypeError, match="declares no execution_timeout_from"):
        apply_task_timeouts(dag)
