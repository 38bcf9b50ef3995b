"""docs/operators.md's team DAG, as written there, run with dag.test(): a team's own tasks around gpuflow's quota
check, export, image build, GPU check and a streaming pipeline's launch, smoke test and cleanup, given plain arguments
and no gpuflow configuration file. On the local profile for real (the emulators); on the gcp profile with Google
Cloud's control planes faked (tests/gcp_fakes), GCS and Pub/Sub the emulators."""

import json
import os

import pytest
from airflow.utils.state import DagRunState

from gpuflow.configuration.model import GpuflowConfig
from tests.helpers import GCP_TEST_PROJECT, ROOT

pytestmark = pytest.mark.timeout(300)

DOC = ROOT / "docs" / "operators.md"
MARKER = "<!-- example-dag -->"
LOCAL_BUNDLE = "airflow.dag_processing.bundles.local.LocalDagBundle"
BUCKET = "gpuflow-team-readiness"
LOCAL_BUCKET = "gpuflow-team-readiness-local"  # its own: the two tests share an emulator


def example_dag_source() -> str:
    text = DOC.read_text()
    block = text.split(MARKER, 1)[1].split("```python\n", 1)[1]
    return block.split("```", 1)[0]


def team_dag(tmp_path, monkeypatch):
    """The page's DAG, its text unchanged, in a DAG folder of the team's own: a second DAG bundle beside gpuflow's
    (dag.test() runs a DAG that a bundle holds; it syncs that bundle to the database first)."""
    try:
        from airflow.dag_processing.dagbag import DagBag
    except ImportError:  # Airflow 3.1 (make test-composer LINE=3.1.8)
        from airflow.models.dagbag import DagBag

    dag_file = tmp_path / "team_gpu_readiness.py"
    dag_file.write_text(example_dag_source())
    monkeypatch.setenv("AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST", json.dumps([
        {"name": "dags-folder", "classpath": LOCAL_BUNDLE, "kwargs": {}},
        {"name": "team-dags", "classpath": LOCAL_BUNDLE, "kwargs": {"path": str(tmp_path)}}]))
    bag = DagBag(str(dag_file))
    assert bag.import_errors == {}
    return bag.dags["team_gpu_readiness"]


def succeeded(run) -> dict:
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert run.state == DagRunState.SUCCESS, states
    assert set(states.values()) == {"success"}
    return run.get_task_instance("readiness_report").xcom_pull(task_ids="readiness_report")


def assert_cleaned_up(run, hook, config) -> None:
    """The cleanup deleted the run's topics, subscriptions and objects under the run's prefix (``config``: what the
    team's arguments make); the team's bucket and model folder stay."""
    from gpuflow.platform import get_platform
    from gpuflow.runs.naming import resource_names, run_prefix
    from gpuflow.steps.resources import list_run_resources

    names = resource_names(config, run_prefix(run.dag_id, run.run_id))
    platform = get_platform(config)
    with platform.environment():
        assert list_run_resources(config, names, platform.conn_id) == {"topics": [], "subscriptions": [], "buckets": []}
    assert hook.list(config.bucket, prefix=f"{names.object_prefix}/") == []
    assert hook.exists(config.bucket, "models/team/state_dict.pth")


def test_the_team_dag_runs_on_the_local_profile_with_plain_arguments(airflow_db, gcs_bucket, tmp_path, monkeypatch):
    hook = gcs_bucket(LOCAL_BUCKET)  # the team's bucket, on the emulator that STORAGE_EMULATOR_HOST names
    # The team's Variables: the offline profile; its waits poll every second
    for name, value in {"PROFILE": "local", "BUCKET": LOCAL_BUCKET, "POLL_S": "1"}.items():
        monkeypatch.setenv(f"AIRFLOW_VAR_GPU_TEAM_{name}", value)
    run = team_dag(tmp_path, monkeypatch).test()
    # This machine: nvidia-smi lists no GPU, and the GPU check ran on the local runner and reported none.
    # No Docker engine here: the worker image was rendered and checked, not built. The demo model was exported into
    # the team's folder of its bucket, on the emulator, and the pipeline that served it answered every prompt.
    assert succeeded(run) == {"quota": "nvidia-smi", "weights": f"gs://{LOCAL_BUCKET}/models/team/state_dict.pth",
                              "image_built": False, "gpu_found": False, "answered": "4/4"}
    assert hook.exists(LOCAL_BUCKET, "models/team/state_dict.pth") and hook.exists(LOCAL_BUCKET, "models/team/config.json")
    assert_cleaned_up(run, hook, GpuflowConfig.model_validate({"profile": "local", "bucket": LOCAL_BUCKET, "local": {
        "pubsub_emulator_host": os.environ["PUBSUB_EMULATOR_HOST"],
        "storage_emulator_host": os.environ["STORAGE_EMULATOR_HOST"]}}))


def test_the_team_dag_runs_on_gcp_with_plain_arguments(airflow_db, gcs_bucket, gcp_env, demo_model_dir, tmp_path,
                                                       monkeypatch):
    from google.cloud import dataflow_v1beta3

    from tests.gcp_fakes import (
        FakeArtifactRegistry,
        FakeCloudBuild,
        FakeDataflow,
        FakeGoogleCloud,
        FakeVertex,
        FakeWorkers,
    )

    hook = gcs_bucket(BUCKET)
    # The team's Variables; its waits poll every second (the fakes answer at once)
    for name, value in {"PROJECT": GCP_TEST_PROJECT, "REGION": "us-central1", "BUCKET": BUCKET, "POLL_S": "1"}.items():
        monkeypatch.setenv(f"AIRFLOW_VAR_GPU_TEAM_{name}", value)
    # The fake workers run the pipeline with the arguments the team's DAG gives (its model folder)
    workers = FakeWorkers(GpuflowConfig.model_validate({
        "profile": "gcp", "project": GCP_TEST_PROJECT, "bucket": BUCKET,
        "export": {"model_dir": f"gs://{BUCKET}/models/team"}}), gcp_env, tmp_path)
    registry = FakeArtifactRegistry()  # the build is done at its first poll
    cloud = FakeGoogleCloud(dataflow=FakeDataflow(workers), registry=registry, vertex=FakeVertex(gcp_env, demo_model_dir),
                            build=FakeCloudBuild(registry, polls_until_done=0)).install(monkeypatch)

    run = team_dag(tmp_path, monkeypatch).test()
    # Cloud Build built the worker image; the GPU check's job ran in it on the workers the arguments named, and its
    # report (an L4's) was judged.
    assert succeeded(run) == {"quota": "compute-quota", "weights": f"gs://{BUCKET}/models/team/state_dict.pth",
                              "image_built": True, "gpu_found": True, "answered": "4/4"}
    # A Vertex AI custom job in the Variables' project and region exported the model (its script, run by the fake
    # from the demo model, wrote the weights to the emulator).
    (export,) = [request for name, request in cloud.vertex.requests if name == "create_custom_job"]
    assert export.parent == f"projects/{GCP_TEST_PROJECT}/locations/us-central1"
    assert f"gs://{BUCKET}/models/team/state_dict.pth".replace("gs://", "/gcs/") in str(export.custom_job)
    assert hook.exists(BUCKET, "models/team/state_dict.pth")
    (build,) = [request for name, request in cloud.build.requests if name == "create_build"]
    assert build.parent == f"projects/{GCP_TEST_PROJECT}/locations/us-central1"
    (image,) = build.build.images
    assert image.startswith(f"us-central1-docker.pkg.dev/{GCP_TEST_PROJECT}/gpuflow/l4:")
    assert build.build.source.storage_source.bucket == BUCKET
    # The quota reads (the check's, and the launch's before it starts its job) were the project's and region's the
    # Variables name; the check's for max_num_workers (the team's task: 2) times gpu_count GPUs.
    assert {(r.project, r.region) for r in cloud.regions.requests} == {(GCP_TEST_PROJECT, "us-central1")}
    quota = run.get_task_instance("gpu_quota").xcom_pull(task_ids="gpu_quota")
    assert {reading["needed"] for reading in quota["readings"]} == {2}
    # Two Dataflow jobs, the GPU check's and the pipeline's, each on the machine the arguments named, in the image
    # just built.
    launches = cloud.dataflow.calls("launch_flex_template") + cloud.dataflow.calls("launch_template")
    assert len(launches) == 2 and all(isinstance(launch, dataflow_v1beta3.LaunchFlexTemplateRequest
                                                 | dataflow_v1beta3.LaunchTemplateRequest) for launch in launches)
    parameters = [launch.launch_parameter if hasattr(launch, "launch_parameter") else launch.launch_parameters
                  for launch in launches]
    assert sorted("gpu-check" if "-gpu-check-" in p.job_name else "pipeline" if "-llm-inference" in p.job_name
                  else p.job_name for p in parameters) == ["gpu-check", "pipeline"]
    assert {p.environment.machine_type for p in parameters} == {"g2-standard-4"}
    assert all(image in str(launch) for launch in launches)
    assert_cleaned_up(run, hook, workers.config)
