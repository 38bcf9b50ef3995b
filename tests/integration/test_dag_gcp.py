"""llm_streaming_inference on the gcp profile under dag.test(), with Google Cloud's control planes faked.

Pub/Sub and GCS are the emulators, reached through the provider's hooks and an anonymous connection. Beam's
DataflowRunner stages every job for real (into the GCS emulator). Vertex AI, Cloud Build, Artifact Registry,
Compute Engine quotas and Dataflow's Templates/Jobs/Messages services are the fakes of tests/gcp_fakes/,
and the fake Dataflow's "workers" run the real pipeline on the DirectRunner, so the smoke test gets real answers.
"""

import json

import pytest
from airflow.utils.state import DagRunState, TaskInstanceState
from google.cloud import aiplatform_v1, dataflow_v1beta3
from google.cloud.devtools import cloudbuild_v1

from gpuflow.configuration.loading import load_config
from gpuflow.runs.naming import resource_names, run_prefix
from gpuflow.steps.resources import list_run_resources
from tests.gcp_fakes import (
    BATCH_SUCCEEDS,
    LAUNCH_FAILS,
    STREAMING_STARTS,
    ZONE_EXHAUSTED,
    FakeDataflow,
    FakeGoogleCloud,
    FakeRegionsClient,
    FakeVertex,
    FakeWorkers,
)
from tests.helpers import GCP_TEST_PROJECT, run_dag, site_config

DAG_ID = "llm_streaming_inference"
PROJECT = GCP_TEST_PROJECT
BUCKET = "gpuflow-gcp-test-bucket"
#: What the site's file sets beyond configs/gcp.example.yaml: the project, bucket and model (a run's conf may set
#: knobs only: gpuflow.runs.run_policy), what the form does not show (a poll interval, the Flex launcher's tag), and
#: the limits that let a run raise its workers (limits.max_gpus).
SITE = {"project": PROJECT, "bucket": BUCKET, "model.name": "google/flan-t5-small", "dataflow.poll_interval_s": 0.05,
        "limits.min_poll_interval_s": 0.01, "limits.max_gpus": 8, "container.flex_launcher_tag": "20260101_RC00"}
#: The team's own identity on a shared Composer environment: every hook acts as its last account.
CHAIN = ["deployer@gpuflow-gcp-test.iam.gserviceaccount.com", "team-ml@gpuflow-gcp-test.iam.gserviceaccount.com"]
RUN_KNOBS = {
    "model__max_new_tokens": 8,
    "require_gpu": False,  # the DirectRunner "workers" of the fake Dataflow run on this CPU
    "smoke_test__num_prompts": 4,
    "smoke_test__timeout_s": 240,
}
CONF = {"config_file": site_config("gcp.yaml", "configs/gcp.example.yaml", impersonation_chain=CHAIN, **SITE),
        **RUN_KNOBS}

#: launch.mode direct (the gcp default is flex_template): Airflow's Beam stages the job as a template. Its file has no
#: impersonation chain: Beam's staging would impersonate through the IAM Credentials API, which no machine here
#: reaches (the staging's --impersonate_service_account: tests/unit/test_cli.py).
DIRECT_CONF = {"config_file": site_config("gcp-direct.yaml", "configs/gcp.example.yaml", **SITE), **RUN_KNOBS,
               "launch__mode": "direct"}


@pytest.fixture
def cloud(gcp_env, monkeypatch, tmp_path, demo_model_dir):
    config = load_config(CONF["config_file"], CONF)
    assert config.project == GCP_TEST_PROJECT
    workers = FakeWorkers(config, gcp_env, tmp_path)
    fake = FakeGoogleCloud(dataflow=FakeDataflow(workers), vertex=FakeVertex(gcp_env, demo_model_dir))
    yield fake.install(monkeypatch)
    for job in fake.dataflow.jobs.values():  # never leave a pipeline behind, whatever the test did
        workers.stop(job)


def task_states(run):
    return {ti.task_id: ti.state for ti in run.get_task_instances()}


def leftovers(run):
    config = load_config(CONF["config_file"], CONF)
    names = resource_names(config, run_prefix(run.dag_id, run.run_id))
    found = list_run_resources(config, names, config.gcp_conn_id)
    from airflow.providers.google.cloud.hooks.gcs import GCSHook

    gcs = GCSHook(gcp_conn_id=config.gcp_conn_id)
    # A run refused before its setup never creates the bucket: no bucket, no objects (listing it would be a 404).
    bucket_exists = gcs.get_conn().bucket(BUCKET).exists()
    found["objects"] = gcs.list(BUCKET, prefix=names.object_prefix + "/") if bucket_exists else []
    return found


NOTHING_LEFT = {"topics": [], "subscriptions": [], "buckets": [], "objects": []}


@pytest.mark.parametrize("deferrable", [True, False], ids=["deferred", "waiting-in-worker"])
def test_success_exports_builds_checks_launches_answers_and_cleans_up(airflow_db, cloud, create_calls, monkeypatch,
                                                                      deferrable):
    """Deferred or waiting in their worker slots (``[operators] default_deferrable``, read as the DAG is parsed),
    the tasks send the same job requests and give the same results: the same checks hold for both."""
    from gpuflow.operators.base import JobWaitingOperator
    from tests.task_trace import TaskFileTrace

    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", str(deferrable))
    deferred = []
    defer = JobWaitingOperator.defer
    monkeypatch.setattr(JobWaitingOperator, "defer", lambda self, **kwargs: (deferred.append(self.task_id),
                                                                             defer(self, **kwargs)))
    trace = TaskFileTrace().install(monkeypatch)
    run = run_dag(DAG_ID, CONF)
    assert run.state == DagRunState.SUCCESS, task_states(run)
    # Each job wait deferred (the tests' worker hold is 0: gpuflow.triggers.settle), or none did.
    assert sorted(set(deferred)) == (["build_container", "cleanup", "export_model", "launch", "smoke_test",
                                      "verify_gpu"] if deferrable else [])
    # docs/architecture.md's task table names every file each task ran code in (its triggers' too), shared helpers
    # aside: a newcomer who opens the row's files follows the task to its Google calls.
    assert trace.unnamed(DAG_ID) == {}
    # Every provider hook, in the tasks and in the triggers, acted as the file's impersonation chain.
    hooks = {(hook, conn_id, tuple(chain) if chain else None) for hook, conn_id, chain in cloud.hooks_made}
    assert {chain for _, _, chain in hooks} == {tuple(CHAIN)}, sorted(hooks, key=str)
    assert {"GCSHook", "PubSubHook", "CustomJobHook", "CloudBuildHook", "DataflowHook", "AsyncDataflowHook",
            "GoogleBaseHook"} <= {hook for hook, _, _ in hooks}
    assert set(task_states(run).values()) == {TaskInstanceState.SUCCESS}
    assert {ti.task_id: ti.try_number for ti in run.get_task_instances() if ti.try_number != 1} == {}  # no retry
    prefix = run_prefix(run.dag_id, run.run_id)

    # Preflight asked Compute Engine which zones offer the GPU; the quota of the run's region and the
    # project-wide GPU quota were read before anything was created, and again right before the launch.
    assert [(r.project, r.filter) for r in cloud.accelerator_types.requests] == [(PROJECT, 'name = "nvidia-l4"')]
    assert [(r.project, r.region) for r in cloud.regions.requests] == [(PROJECT, "us-central1")] * 2
    assert [r.project for r in cloud.projects.requests] == [PROJECT] * 2
    # Vertex AI: one custom job on the guide's machine for flan-t5-small, polled to SUCCEEDED.
    (create,) = [r for n, r in cloud.vertex.requests if n == "create_custom_job"]
    (pool,) = create.custom_job.job_spec.worker_pool_specs
    assert (pool.machine_spec.machine_type, pool.disk_spec.boot_disk_size_gb) == ("e2-standard-4", 100)
    assert create.parent == f"projects/{PROJECT}/locations/us-central1"
    # Cloud Build: the tag was missing, so it built and pushed it.
    (build,) = [r for n, r in cloud.build.requests if n == "create_build"]
    image = build.build.images[0]
    assert image.startswith(f"us-central1-docker.pkg.dev/{PROJECT}/gpuflow/l4:")
    # Dataflow, in the gcp profile's default launch mode: the GPU check (batch) then the streaming job, each a Flex
    # Template whose launcher is the worker image itself, so nothing is staged by the Airflow worker's Beam; the
    # request check passes on what was sent.
    assert cloud.dataflow.calls("launch_template") == []
    launches = cloud.dataflow.calls("launch_flex_template")
    assert [r.launch_parameter.job_name for r in launches] == [f"{prefix}-gpu-check-us-central1-l4",
                                                               f"{prefix}-llm-inference-us-central1-l4"]
    for launch in launches:
        spec_uri = launch.launch_parameter.container_spec_gcs_path
        assert spec_uri.startswith(f"gs://{BUCKET}/gpuflow/{prefix}/templates/")
        assert cloud.dataflow.staged[spec_uri]["image"] == image == launch.launch_parameter.environment.sdk_container_image
    from gpuflow.dataflow.constraints import violations
    from gpuflow.dataflow.request import from_flex_launch
    from gpuflow.images.containers import image_cuda

    config = load_config(CONF["config_file"], CONF)
    assert violations(from_flex_launch(launches[-1].launch_parameter, image_cuda(config))) == []
    # The smoke test got every answer back from the running pipeline, and cleanup cancelled the job.
    ti = {t.task_id: t for t in run.get_task_instances()}
    assert ti["smoke_test"].xcom_pull(task_ids="smoke_test")["answered"] == 4
    handle = ti["launch"].xcom_pull(task_ids="launch", key="job_handle")
    assert handle["url"] == f"https://console.cloud.google.com/dataflow/jobs/us-central1/{handle['id']}?project={PROJECT}"
    # The operator extra links Airflow stored for the UI: Dataflow job, Vertex AI job, Cloud Build.
    assert ti["launch"].xcom_pull(task_ids="launch", key="_link_DataflowConsoleLink") == handle["url"]
    assert "/vertex-ai/locations/us-central1/training/4411" in ti["export_model"].xcom_pull(
        task_ids="export_model", key="_link_VertexAIConsoleLink")
    assert ti["build_container"].xcom_pull(task_ids="build_container", key="_link_CloudBuildConsoleLink").endswith(
        f"/b7e1c0de?project={PROJECT}")
    cancels = cloud.dataflow.calls("update_job")
    assert [(r.job_id, dataflow_v1beta3.JobState(r.job.requested_state).name) for r in cancels] == [
        (handle["id"], "JOB_STATE_CANCELLED")]
    assert ti["cleanup"].xcom_pull(task_ids="cleanup")["stopped_jobs"] == [handle["id"]]  # deferred until stopped
    assert leftovers(run) == NOTHING_LEFT

    # Nothing gpuflow makes goes unlabelled: bucket, topics and subscriptions (through the provider's hooks), the
    # Vertex AI job, both Dataflow jobs (their launch requests), and the build's tags.
    from tests.helpers import assert_all_labelled

    names = resource_names(load_config(CONF["config_file"]), prefix)
    assert names.labels["gpuflow-site"] == "gcp"  # the site whose file made the run: gcp.yaml's
    assert {"topic", "subscription"} <= {kind for kind, _, _ in create_calls}  # (the configured bucket exists)
    assert_all_labelled(create_calls, names)
    assert dict(create.custom_job.labels) == names.labels
    assert [dict(r.launch_parameter.environment.additional_user_labels) for r in launches] == [names.labels] * 2
    assert f"gpuflow-run-{prefix}" in build.build.tags


def test_a_failure_in_launch_cancels_the_job_and_deletes_everything(airflow_db, cloud):
    cloud.dataflow.scripts = [BATCH_SUCCEEDS, LAUNCH_FAILS]  # the GPU check succeeds, the streaming job fails
    run = run_dag(DAG_ID, CONF)
    states = task_states(run)
    assert run.state == DagRunState.FAILED
    assert states["launch"] == TaskInstanceState.FAILED
    assert states["smoke_test"] == TaskInstanceState.UPSTREAM_FAILED
    assert states["cleanup"] == TaskInstanceState.SUCCESS
    assert leftovers(run) == NOTHING_LEFT


def test_an_exhausted_zone_falls_back_to_the_next_region_and_succeeds(airflow_db, cloud):
    cloud.dataflow.scripts = [BATCH_SUCCEEDS, ZONE_EXHAUSTED, STREAMING_STARTS]
    conf = {**DIRECT_CONF, "config_file": site_config("gcp-fallback.yaml", DIRECT_CONF["config_file"],
                                               **{"gpu.fallbacks": [{"region": "us-east4"}]})}
    run = run_dag(DAG_ID, conf)
    assert run.state == DagRunState.SUCCESS, task_states(run)
    prefix = run_prefix(run.dag_id, run.run_id)
    launches = cloud.dataflow.calls("launch_template")
    assert [(r.location, r.launch_parameters.job_name) for r in launches[1:]] == [
        ("us-central1", f"{prefix}-llm-inference-us-central1-l4"),
        ("us-east4", f"{prefix}-llm-inference-us-east4-l4"),
    ]
    # The exhausted job was cancelled at once; the fallback job was cancelled by cleanup.
    stopped = [(r.location, r.job_id) for r in cloud.dataflow.calls("update_job")]
    assert [location for location, _ in stopped] == ["us-central1", "us-east4"]
    handle = {t.task_id: t for t in run.get_task_instances()}["launch"].xcom_pull(task_ids="launch")
    assert handle["location"] == "us-east4"


def test_quota_taken_by_another_run_after_the_check_stops_the_launch(airflow_db, cloud):
    """Another run's workers took the region's L4s between check_quota and launch: the launch's own check refuses."""
    regions = cloud.regions

    class TakenAfterTheCheck:
        requests = regions.requests

        def get(self, request):
            if len(regions.requests) == 1:  # the first read is check_quota's; then another run takes 6 of 8
                regions.quotas_by_region["us-central1"] = [("NVIDIA_L4_GPUS", 8, 6)]
            return regions.get(request)

    cloud.regions = TakenAfterTheCheck()
    run = run_dag(DAG_ID, {**DIRECT_CONF, "worker__max_num_workers": 4})
    states = task_states(run)
    assert (states["check_quota"], states["launch"], states["cleanup"]) == (
        TaskInstanceState.SUCCESS, TaskInstanceState.FAILED, TaskInstanceState.SUCCESS)
    assert [r.launch_parameters.job_name for r in cloud.dataflow.calls("launch_template")] == [
        f"{run_prefix(run.dag_id, run.run_id)}-gpu-check-us-central1-l4"]  # the streaming job never started
    assert leftovers(run) == NOTHING_LEFT


def test_too_little_quota_fails_before_anything_is_created(airflow_db, cloud):
    cloud.regions = FakeRegionsClient({"us-central1": [("NVIDIA_L4_GPUS", 4, 4)]})
    run = run_dag(DAG_ID, CONF)
    states = task_states(run)
    assert run.state == DagRunState.FAILED
    assert states["check_quota"] == TaskInstanceState.FAILED
    assert states["setup"] == TaskInstanceState.UPSTREAM_FAILED
    assert cloud.vertex.requests == [] and cloud.dataflow.requests == []


def test_a_missing_permission_fails_preflight_and_nothing_is_created(airflow_db, cloud, create_calls):
    cloud.access.denied = {"dataflow.jobs.create", "cloudbuild.builds.create"}
    run = run_dag(DAG_ID, CONF)
    states = task_states(run)
    assert run.state == DagRunState.FAILED
    assert states["preflight"] == TaskInstanceState.FAILED
    assert TaskInstanceState.SUCCESS not in {state for task, state in states.items() if task != "preflight"}
    assert create_calls == []  # no topic, subscription or bucket
    assert cloud.vertex.requests == [] and cloud.dataflow.requests == []
    # Cloud Build was only read (which account builds run as: the access check), never asked to build.
    assert {name for name, _ in cloud.build.requests} <= {"get_default_service_account"}
    assert leftovers(run) == NOTHING_LEFT


def test_requests_are_the_api_types(cloud):
    """The fakes refuse anything but the API's own request types; this checks that they do."""
    with pytest.raises(AssertionError):
        cloud.dataflow.launch_template(json.dumps({"gcs_path": "gs://x"}))
    with pytest.raises(AssertionError):
        cloud.vertex.create_custom_job({"parent": "projects/p"})
    with pytest.raises(AssertionError):
        cloud.build.create_build(cloudbuild_v1.Build())
    with pytest.raises(AssertionError):
        cloud.vertex.get_custom_job(aiplatform_v1.CustomJob(name="projects/p/locations/l/customJobs/1"))


MODES = {
    # guide 002's own pipeline on CPU workers: no accelerator, one SDK process, the guide's n2-highmem machine.
    # (The other GPU modes differ only in the request they send: right fitting with model copies in
    # test_gcp_gpu_modes.py, one SDK process per worker (t4) in test_gcp_dataflow_request.py, each checked against
    # Dataflow's constraints as the launch checks it.)
    # The machine type is the site's: a run may not pick one without limits.max_usd_per_hour (gpuflow.runs.run_policy).
    "cpu_workers": ({"config_file": site_config("gcp-cpu.yaml", DIRECT_CONF["config_file"], **{
        "gpu.type": "none", "gpu.machine_type": "n2-highmem-2"})}, [], True),
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_each_direct_mode_runs_the_dag_and_sends_what_it_should(airflow_db, cloud, mode):
    extra, service_options, single_process = MODES[mode]
    run = run_dag(DAG_ID, {**DIRECT_CONF, **extra})
    assert run.state == DagRunState.SUCCESS, task_states(run)
    from airflow.providers.google.cloud.hooks.gcs import GCSHook

    gcs = GCSHook(gcp_conn_id="google_cloud_default")
    launch = cloud.dataflow.calls("launch_template")[-1]  # the streaming job
    suffix = "cpu" if mode == "cpu_workers" else "l4"
    assert launch.launch_parameters.job_name.endswith(f"-llm-inference-us-central1-{suffix}")
    # The launch restates the experiments; the staged request (kept by the fake at launch: cleanup deletes the
    # run's prefix) carries the service options.
    assert ("no_use_multiple_sdk_containers" in launch.launch_parameters.environment.additional_experiments) is (
        single_process)
    staged = cloud.dataflow.staged[launch.gcs_path]
    assert staged["environment"].get("serviceOptions", []) == service_options
    if mode == "cpu_workers":  # no GPU check job, no GPU quota read, no GPU metrics to wait for
        assert len(cloud.dataflow.calls("launch_template")) == 1 and cloud.regions.requests == []
        (pool,) = staged["environment"]["workerPools"]
        assert pool["machineType"] == "n2-highmem-2"
        smoke = {t.task_id: t for t in run.get_task_instances()}["smoke_test"].xcom_pull(task_ids="smoke_test")
        assert smoke["answered"] == 4 and smoke["gpu_usage"]["source"] == "none"
    assert not gcs.list(BUCKET, prefix=f"gpuflow/{run_prefix(run.dag_id, run.run_id)}/")


def test_flex_template_mode_with_mps_runs_the_dag_without_staging_in_airflow(airflow_db, cloud):
    run = run_dag(DAG_ID, {**CONF, "launch__mode": "flex_template", "gpu__sharing": "mps",
                             "gpu__machine_type": "g2-standard-8"})
    assert run.state == DagRunState.SUCCESS, task_states(run)
    launches = cloud.dataflow.calls("launch_flex_template")
    assert [r.launch_parameter.parameters["gpuflow_job"] for r in launches] == ["gpu_check", "llm_inference"]
    assert cloud.dataflow.calls("launch_template") == []
    assert launches[-1].launch_parameter.parameters["dataflow_service_options"].endswith(";use_nvidia_mps")
    smoke = {t.task_id: t for t in run.get_task_instances()}["smoke_test"].xcom_pull(task_ids="smoke_test")
    assert smoke["gpu_usage"]["max_utilization"] == 0.63  # read back from (fake) Cloud Monitoring


def test_a_job_whose_gpus_stay_idle_fails_the_smoke_test_and_is_cleaned_up(airflow_db, cloud):
    from tests.gcp_fakes import FakeMonitoring

    cloud.metrics = FakeMonitoring(utilization=0, memory=0)
    run = run_dag(DAG_ID, {**CONF, "launch__mode": "flex_template"})
    states = task_states(run)
    assert run.state == DagRunState.FAILED
    assert (states["launch"], states["smoke_test"], states["cleanup"]) == (
        TaskInstanceState.SUCCESS, TaskInstanceState.FAILED, TaskInstanceState.SUCCESS)
    assert leftovers(run) == NOTHING_LEFT
