"""The janitor on the gcp profile: Dataflow faked at the client boundary, Pub/Sub and GCS on the emulators, run
states from the real Airflow database. A run that died mid-launch (its setup done, its job started, its DAG run
deleted) is found and removed exactly; a recorded deployment's topics and job stay."""

import pytest
from google.cloud import dataflow_v1beta3

from gpuflow.configuration.loading import load_config
from gpuflow.platform import JobHandle
from gpuflow.platform.gcp import GcpPlatform
from gpuflow.platform.records import Records
from gpuflow.runs.naming import deployment_prefix, resource_names
from gpuflow.runs.rollout import DeploymentRecord, job_options
from gpuflow.steps.janitor import clean_up, find_leftovers
from gpuflow.steps.resources import create_resources, delete_resources, list_named
from tests.gcp_fakes import STREAMING_STARTS, FakeGoogleCloud
from tests.helpers import GCP_TEST_PROJECT

BUCKET = "gpuflow-janitor-gcp-test"
JobState = dataflow_v1beta3.JobState


def airflow_run_state(dag_id: str, run_id: str):
    """What the janitor task asks the Task SDK for, read from this test's Airflow database."""
    from airflow.models.dagrun import DagRun

    runs = DagRun.find(dag_id=dag_id, run_id=run_id)
    if not runs:
        raise LookupError(f"no DAG run {dag_id} {run_id}")
    return runs[0].state


@pytest.fixture
def cloud(gcs_bucket, monkeypatch, airflow_db):
    gcs_bucket(BUCKET)
    return FakeGoogleCloud().install(monkeypatch)


def config_of(*overrides):
    return load_config("configs/gcp.example.yaml", overrides=[
        f"project={GCP_TEST_PROJECT}", f"bucket={BUCKET}", "dataflow.poll_interval_s=0.001", *overrides])


def test_the_janitor_removes_a_killed_runs_job_topics_and_objects_and_keeps_a_recorded_deployment(cloud):
    ephemeral, persistent = config_of(), config_of("deployment.mode=persistent", "deployment.name=chat")
    platform = GcpPlatform(ephemeral)
    # A live deployment: created by a run that has finished (its own subscriptions and objects are gone).
    deployer = resource_names(persistent, "gf-00000000aa")
    create_resources(persistent, deployer, platform.conn_id, lease=("llm_streaming_inference", "manual__deployed"))
    serving = cloud.dataflow.scripted_job(STREAMING_STARTS, name=deployer.job_name, labels=deployer.labels)
    Records(persistent, platform.conn_id).write(DeploymentRecord(
        name="chat", job=serving.to_xcom(), job_name=serving.name, subscription=deployer.prompts_subscription,
        image="image", model_version=deployer.model_version, model_dir_uri=deployer.model_dir_uri,
        state_dict_uri=deployer.state_dict_uri, options=job_options(persistent), changed_by="manual__deployed"))
    delete_resources(persistent, deployer, platform.conn_id)
    deployment_before = list_named(persistent, platform.conn_id, deployment_prefix("chat"))
    # A run killed mid-launch: its setup ran, its job started, its DAG run was deleted.
    killed = resource_names(ephemeral, "gf-00000000bb")
    create_resources(ephemeral, killed, platform.conn_id, lease=("llm_streaming_inference", "manual__deleted"))
    orphan = cloud.dataflow.scripted_job(STREAMING_STARTS, name=f"{killed.prefix}-llm-inference-us-central1-l4",
                                         labels=killed.labels)
    cloud.dataflow.get_job(dataflow_v1beta3.GetJobRequest(job_id=orphan.id))

    leftovers = find_leftovers(ephemeral, platform, airflow_run_state)

    assert [job["id"] for job in leftovers["jobs"]] == [orphan.id]
    assert sorted(leftovers["topics"]) == sorted(killed.topics)
    assert sorted(leftovers["subscriptions"]) == sorted(killed.subscriptions)
    assert leftovers["prefixes"] == [f"gs://{BUCKET}/gpuflow/{killed.prefix}/"] and leftovers["buckets"] == []

    for job in leftovers["jobs"]:
        assert platform.request_stop(JobHandle.model_validate(job), drain=False)
    clean_up(ephemeral, platform, leftovers)

    (stop,) = cloud.dataflow.calls("update_job")
    assert stop.job_id == orphan.id and JobState(stop.job.requested_state) == JobState.JOB_STATE_CANCELLED
    assert list_named(ephemeral, platform.conn_id, killed.prefix) == {"topics": [], "subscriptions": []}
    assert cloud.dataflow.jobs[serving.id].stopped_state is None
    assert list_named(persistent, platform.conn_id, deployment_prefix("chat")) == deployment_before
    # Dataflow still lists a job while it is being cancelled; the cleanup's trigger polls until it has ended.
    assert [job["id"] for job in find_leftovers(ephemeral, platform, airflow_run_state)["jobs"]] == [orphan.id]
    polled = cloud.dataflow.get_job(dataflow_v1beta3.GetJobRequest(job_id=orphan.id))
    assert JobState(polled.current_state) == JobState.JOB_STATE_CANCELLED
    again = find_leftovers(ephemeral, platform, airflow_run_state)
    again.pop("left_alone")  # (what other tests made by hand, unlabelled, is left alone, and listed)
    assert again == {"jobs": [], "subscriptions": [], "topics": [], "buckets": [], "prefixes": []}
    Records(persistent, platform.conn_id).delete("chat")
    clean_up(persistent, platform, {"jobs": [], "buckets": [], "prefixes": [], **deployment_before})


def publish(hook, project: str, topic: str, count: int) -> None:
    hook.publish(project_id=project, topic=topic, messages=[{"data": f"event {i}".encode()} for i in range(count)])


def test_what_is_only_named_like_gpuflows_survives_a_real_janitor_run_with_its_messages(cloud):
    """A team's own gfd-/gf- topics and subscription (with a backlog), a bucket named <project>-gf-<hex> and a
    Dataflow job named gf-…, none with gpuflow's labels, and a resource whose label names another run: all left
    alone and listed with why. A gpuflow-labelled leftover of a killed run beside them is deleted."""
    from airflow.providers.google.cloud.hooks.gcs import GCSHook
    from airflow.providers.google.cloud.hooks.pubsub import PubSubHook

    config = config_of()
    platform = GcpPlatform(config)
    pubsub, gcs = PubSubHook(gcp_conn_id=platform.conn_id), GCSHook(gcp_conn_id=platform.conn_id)
    team_topics = ["gfd-analytics-events", "gf-0123456789-events"]
    for topic in team_topics:
        pubsub.create_topic(topic=topic, project_id=GCP_TEST_PROJECT)
    pubsub.create_subscription(topic="gfd-analytics-events", subscription="gfd-analytics-events-reader",
                               project_id=GCP_TEST_PROJECT)
    publish(pubsub, GCP_TEST_PROJECT, "gfd-analytics-events", 3)
    # Labelled, but for another run than its name says: not provably what it claims to be.
    pubsub.create_topic(topic="gf-00000000cc-prompts", project_id=GCP_TEST_PROJECT,
                        labels={"gpuflow-run": "gf-00000000dd"})
    team_bucket = f"{GCP_TEST_PROJECT}-gf-0123456789"
    gcs.create_bucket(bucket_name=team_bucket, project_id=GCP_TEST_PROJECT)
    team_job = cloud.dataflow.scripted_job(STREAMING_STARTS, name="gf-0123456789-nightly-etl")
    # A gpuflow leftover beside them: a killed run's labelled topics and subscriptions, its DAG run gone.
    killed = resource_names(config, "gf-00000000ee")
    create_resources(config, killed, platform.conn_id, lease=("llm_streaming_inference", "manual__gone"))
    try:
        leftovers = find_leftovers(config, platform, airflow_run_state)
        alone = {item["name"]: item["why"] for item in leftovers["left_alone"]}
        assert {*team_topics, "gfd-analytics-events-reader", team_bucket, team_job.name} <= set(alone)
        assert "no gpuflow labels" in alone["gfd-analytics-events-reader"]
        assert alone["gf-00000000cc-prompts"] == "named for run gf-00000000cc, but labelled gpuflow-run=gf-00000000dd"
        assert sorted(leftovers["topics"]) == sorted(killed.topics) and leftovers["jobs"] == []
        assert sorted(leftovers["subscriptions"]) == sorted(killed.subscriptions)
        assert team_bucket not in leftovers["buckets"]

        clean_up(config, platform, leftovers)

        left = list_named(config, platform.conn_id, ("gf-", "gfd-"))
        assert {*team_topics, "gf-00000000cc-prompts"} <= set(left["topics"])
        assert not set(killed.topics) & set(left["topics"])
        pulled = pubsub.pull(project_id=GCP_TEST_PROJECT, subscription="gfd-analytics-events-reader",
                             max_messages=10, return_immediately=False)
        assert sorted(m.message.data for m in pulled) == [b"event 0", b"event 1", b"event 2"]
        assert gcs.get_conn().bucket(team_bucket).exists()
        assert cloud.dataflow.calls("update_job") == [] and cloud.dataflow.jobs[team_job.id].stopped_state is None
    finally:
        pubsub.delete_subscription(subscription="gfd-analytics-events-reader", project_id=GCP_TEST_PROJECT,
                                   fail_if_not_exists=False)
        for topic in [*team_topics, "gf-00000000cc-prompts"]:
            pubsub.delete_topic(topic=topic, project_id=GCP_TEST_PROJECT, fail_if_not_exists=False)
        gcs.delete_bucket(bucket_name=team_bucket, force=True)
        delete_resources(config, killed, platform.conn_id)
