"""llm_streaming_inference end to end on the local profile, with the real Airflow (dag.test())."""

import pytest
from airflow.utils.state import DagRunState, TaskInstanceState

from gpuflow.runs.naming import resource_names, run_prefix
from gpuflow.steps.resources import list_run_resources

DAG_ID = "llm_streaming_inference"


@pytest.fixture
def dag(airflow_db):
    """The DAG of the test's local site (its emulators' ports, its state folder)."""
    from tests.helpers import local_site_file, site_dag

    return site_dag(local_site_file(), DAG_ID)


def run_conf(local_config, **extra):
    return {"model__max_new_tokens": 8, **extra}


def task_states(run):
    return {ti.task_id: ti.state for ti in run.get_task_instances()}


def leftovers(local_config, run):
    from gpuflow.platform.emulators import LOCAL_CONN_ID, emulator_environment

    names = resource_names(local_config, run_prefix(run.dag_id, run.run_id))
    with emulator_environment(local_config):
        return list_run_resources(local_config, names, LOCAL_CONN_ID)


def state_dict_events(run_id: str) -> list[dict]:
    """The extra of each gpuflow_state_dict asset event that run_id's export_model emitted."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from gpuflow.operators.streaming import STATE_DICT_ASSET

    with create_session() as session:
        events = session.scalars(select(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
                                 .where(AssetModel.uri == STATE_DICT_ASSET.uri, AssetEvent.source_run_id == run_id))
        return [dict(event.extra) for event in events]


def test_two_runs_in_a_row_both_succeed_and_leave_nothing(dag, local_config, emulators, create_calls):
    from tests.helpers import assert_all_labelled

    for _ in range(2):
        create_calls.clear()
        run = dag.test(run_conf=run_conf(local_config))
        # Nothing gpuflow makes goes unlabelled: the bucket, topics, subscriptions and the processes it starts.
        assert {kind for kind, _, _ in create_calls} == {"bucket", "topic", "subscription", "process"}
        assert_all_labelled(create_calls, resource_names(local_config, run_prefix(run.dag_id, run.run_id)))
        assert run.state == DagRunState.SUCCESS, task_states(run)
        assert set(task_states(run).values()) == {TaskInstanceState.SUCCESS}
        assert leftovers(local_config, run) == {"topics": [], "subscriptions": [], "buckets": []}
        names = resource_names(local_config, run_prefix(run.dag_id, run.run_id))
        assert state_dict_events(run.run_id) == [{"state_dict_uri": names.state_dict_uri, "model": "gpuflow-demo",
                                                  "model_dir_uri": names.model_dir_uri, "kept": False}]


def test_a_failure_in_launch_still_runs_cleanup_and_the_run_fails(airflow_db, local_config, emulators):
    from tests.helpers import local_site_file, site_config, site_dag

    too_short = site_config("launch-too-short.yaml", local_site_file(), **{"local.pipeline_start_timeout_s": 0.001})
    run = site_dag(too_short, DAG_ID).test(run_conf=run_conf(local_config))
    states = task_states(run)
    assert run.state == DagRunState.FAILED
    assert states["launch"] == TaskInstanceState.FAILED
    assert states["smoke_test"] == TaskInstanceState.UPSTREAM_FAILED
    assert states["cleanup"] == TaskInstanceState.SUCCESS
    assert leftovers(local_config, run) == {"topics": [], "subscriptions": [], "buckets": []}


@pytest.mark.parametrize("bad", [{"worker__disk_size_gb": 20},
                                 # beyond the smoke_test task's execution_timeout, which the site's file allows
                                 {"smoke_test__timeout_s": 7200}])
def test_a_bad_configuration_fails_in_preflight_before_anything_exists(airflow_db, local_config, emulators, bad):
    from tests.helpers import local_site_file, site_config, site_dag

    hours = site_config("long-waits.yaml", local_site_file(), **{"limits.max_job_hours": 3})
    run = site_dag(hours, DAG_ID).test(run_conf=run_conf(local_config, **bad))
    states = task_states(run)
    assert run.state == DagRunState.FAILED
    assert states["preflight"] == TaskInstanceState.FAILED
    assert states["setup"] == TaskInstanceState.UPSTREAM_FAILED
    assert leftovers(local_config, run) == {"topics": [], "subscriptions": [], "buckets": []}


def test_a_decoder_only_model_serves_through_the_streaming_dag(dag, local_config, emulators):
    """model.name gpuflow-demo-causal (Llama-shaped): exported, launched and asked like the T5."""
    run = dag.test(run_conf=run_conf(local_config, model__name="gpuflow-demo-causal"))
    assert run.state == DagRunState.SUCCESS, task_states(run)
    smoke = run.get_task_instance("smoke_test").xcom_pull(task_ids="smoke_test")
    assert smoke["answered"] == smoke["sent"] > 0 and all(row["answer"] for row in smoke["answers"])
    assert leftovers(local_config, run) == {"topics": [], "subscriptions": [], "buckets": []}
