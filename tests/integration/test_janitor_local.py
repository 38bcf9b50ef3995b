"""The janitor on the local profile, run for real (``dag.test()``) on the emulators: what is only named like
gpuflow's survives, messages included; a gpuflow-labelled leftover of a killed run beside it is deleted. A project
of its own on the emulators, so no other test's resources are judged."""

import pytest
from airflow.utils.state import DagRunState

from gpuflow.configuration.loading import load_config
from gpuflow.platform.emulators import LOCAL_CONN_ID, emulator_environment
from gpuflow.runs.naming import resource_names
from gpuflow.steps.resources import create_resources, delete_resources, list_named

PROJECT = "gpuflow-janitor-local"
TEAM_TOPICS = ["gfd-analytics-events", "gf-0123456789-events"]
TEAM_SUBSCRIPTION = "gfd-analytics-events-reader"
TEAM_BUCKET = f"{PROJECT}-gf-0123456789"


@pytest.fixture
def janitor(airflow_db):
    """The janitor of a site file: ``janitor(config_file).test()``."""
    from tests.helpers import site_dag

    return lambda config_file: site_dag(config_file, "gpuflow_janitor")


@pytest.fixture
def config_file(local_config, emulators):
    """The janitor's project is the site's (a run's conf cannot pick the project it deletes in)."""
    from tests.helpers import local_site_file, site_config

    return site_config("janitor-project.yaml", local_site_file(), project=PROJECT)


@pytest.fixture
def config(config_file):
    return load_config(config_file)


def test_a_real_janitor_run_deletes_only_what_gpuflow_labelled(janitor, config, config_file):
    from airflow.providers.google.cloud.hooks.gcs import GCSHook
    from airflow.providers.google.cloud.hooks.pubsub import PubSubHook

    from tests.helpers import site_config

    with emulator_environment(config):
        pubsub, gcs = PubSubHook(gcp_conn_id=LOCAL_CONN_ID), GCSHook(gcp_conn_id=LOCAL_CONN_ID)
        for topic in TEAM_TOPICS:
            pubsub.create_topic(topic=topic, project_id=PROJECT)
        pubsub.create_subscription(topic=TEAM_TOPICS[0], subscription=TEAM_SUBSCRIPTION, project_id=PROJECT)
        pubsub.publish(project_id=PROJECT, topic=TEAM_TOPICS[0],
                       messages=[{"data": f"event {i}".encode()} for i in range(3)])
        gcs.create_bucket(bucket_name=TEAM_BUCKET, project_id=PROJECT)
        killed = resource_names(config, "gf-00000000ff")  # its own bucket, labelled, and its DAG run gone
        create_resources(config, killed, LOCAL_CONN_ID, lease=("llm_streaming_inference", "manual__gone"))
        # Another site's killed run in the same project: that site's janitor judges it, this one leaves it alone.
        other_site = load_config(site_config("other-site.yaml", config_file))
        elsewhere = resource_names(other_site, "gf-00000000fe")
        create_resources(other_site, elsewhere, LOCAL_CONN_ID, lease=("other-site__llm_streaming_inference",
                                                                        "manual__gone"))
    try:
        run = janitor(config_file).test()
        assert run.state == DagRunState.SUCCESS
        result = run.get_task_instance("janitor").xcom_pull(task_ids="janitor")
        assert result["dry_run"] is False
        alone = {item["name"]: item["why"] for item in result["left_alone"]}
        assert {*TEAM_TOPICS, TEAM_SUBSCRIPTION, TEAM_BUCKET} <= set(alone), alone
        assert sorted(result["topics"]) == sorted(killed.topics) and result["buckets"] == [killed.bucket]
        for name in [*elsewhere.topics, *elsewhere.subscriptions, elsewhere.bucket]:
            assert alone[name] == ("made by site other-site's DAGs; this janitor judges site janitor-project's "
                                   "only"), (name, alone.get(name))
        with emulator_environment(config):
            left = list_named(config, LOCAL_CONN_ID, ("gf-", "gfd-"))
            assert set(TEAM_TOPICS) <= set(left["topics"]) and TEAM_SUBSCRIPTION in left["subscriptions"]
            assert not set(killed.topics) & set(left["topics"])
            assert set(elsewhere.topics) <= set(left["topics"]) and gcs.get_conn().bucket(elsewhere.bucket).exists()
            pulled = pubsub.pull(project_id=PROJECT, subscription=TEAM_SUBSCRIPTION, max_messages=10,
                                 return_immediately=False)
            assert sorted(m.message.data for m in pulled) == [b"event 0", b"event 1", b"event 2"]
            assert gcs.get_conn().bucket(TEAM_BUCKET).exists() and not gcs.get_conn().bucket(killed.bucket).exists()
    finally:
        with emulator_environment(config):
            pubsub.delete_subscription(subscription=TEAM_SUBSCRIPTION, project_id=PROJECT, fail_if_not_exists=False)
            for topic in TEAM_TOPICS:
                pubsub.delete_topic(topic=topic, project_id=PROJECT, fail_if_not_exists=False)
            gcs.delete_bucket(bucket_name=TEAM_BUCKET, force=True)
            delete_resources(config, killed, LOCAL_CONN_ID)
            delete_resources(other_site, elsewhere, LOCAL_CONN_ID)


def test_a_killed_runs_rollout_evaluation_is_stopped_and_its_answers_swept(janitor, config, config_file):
    """A run killed while its rollout gate evaluated (gpuflow.steps.evaluation): its evaluation job still runs, its
    answers lie under its folder in the team's bucket, and its DAG run is gone. The janitor stops the one and deletes
    the other, and leaves the bucket and what else lies in it."""
    import json
    import sys
    from pathlib import Path

    from airflow.providers.google.cloud.hooks.gcs import GCSHook

    from gpuflow.platform.emulators import process_alive, stop_process_group
    from gpuflow.platform.processes import LABELS_VARIABLE, spawn_logged
    from gpuflow.steps.evaluation import answers_folder
    from tests.helpers import site_config

    bucket = f"{PROJECT}-team"
    shared = site_config("janitor-shared-bucket.yaml", config_file, bucket=bucket)
    team = load_config(shared)
    killed = resource_names(team, "gf-00000000ed")
    answers = answers_folder(killed, "candidate") + "responses.jsonl"
    state_dir = Path(team.local.state_dir)
    with emulator_environment(team):
        gcs = GCSHook(gcp_conn_id=LOCAL_CONN_ID)
        gcs.create_bucket(bucket_name=bucket, project_id=PROJECT)
        gcs.upload(bucket, "team/keep.jsonl", data="{}\n")
        create_resources(team, killed, LOCAL_CONN_ID, pubsub=False, lease=("llm_streaming_inference", "manual__gone"))
        gcs.upload(bucket, answers.removeprefix(f"gs://{bucket}/"), data='{"id": "a", "response": "x"}\n')
    stem = f"{killed.prefix}-eval-candidate"  # as LocalProcesses.launch_pipeline names an evaluation job's files
    pid = spawn_logged([sys.executable, "-c", "import time; time.sleep(900)", "llm_inference.py"],
                       state_dir / f"{stem}.log", {**__import__("os").environ,
                                                    LABELS_VARIABLE: json.dumps(killed.labels)})
    (state_dir / f"{stem}.pid").write_text(str(pid))
    try:
        run = janitor(shared).test()
        assert run.state == DagRunState.SUCCESS
        result = run.get_task_instance("janitor").xcom_pull(task_ids="janitor")
        assert [job["id"] for job in result["jobs"]] == [str(pid)]
        assert any(killed.prefix in prefix for prefix in result["prefixes"]), result["prefixes"]
        assert not process_alive(pid)
        with emulator_environment(team):
            assert gcs.list(bucket, prefix=killed.object_prefix) == []
            assert gcs.list(bucket, prefix="team/") == ["team/keep.jsonl"]
    finally:
        stop_process_group(pid)
        with emulator_environment(team):
            gcs.delete_bucket(bucket_name=bucket, force=True)
