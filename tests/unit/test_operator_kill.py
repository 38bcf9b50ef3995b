"""A killed task cancels its job whether it deferred or waits in its worker slot (``deferrable=False``), for each
operator that waits on a Google job. Deferred: the trigger's ``on_kill`` (Airflow 3.3's triggerer calls it).
Waiting in its worker: the operator's own ``on_kill``, which Airflow calls when it stops the task.

Each operator runs its real ``execute``. Only the step that starts the job is replaced, by one that starts a job in
the fakes that never ends by itself. That step's requests are the gcp DAG tests' (tests/integration/test_dag_gcp.py).
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import TaskDeferred
from google.cloud import dataflow_v1beta3
from google.cloud.devtools import cloudbuild_v1

from gpuflow.operators.batch import RunBatchOperator
from gpuflow.operators.streaming import (
    BuildContainerOperator,
    ExportModelOperator,
    LaunchPipelineOperator,
    VerifyGpuOperator,
)
from gpuflow.platform import JobHandle
from gpuflow.steps.placements import Placement
from tests.gcp_fakes import FakeGoogleCloud, FakeVertex, JobState, gcp_test_config
from tests.helpers import GCP_TEST_PROJECT, RecordingTI, wait_until

pytestmark = pytest.mark.timeout(120)

VERTEX_JOB = f"projects/{GCP_TEST_PROJECT}/locations/us-central1/customJobs/4411"
NEVER_ENDS = [(JobState.JOB_STATE_PENDING, [])]  # a Dataflow job whose workers never come


@pytest.fixture
def cloud(monkeypatch, gcp_connection):
    cloud = FakeGoogleCloud().install(monkeypatch)
    cloud.vertex = FakeVertex(running_polls=10**6)
    return cloud


def start_export(cloud, monkeypatch, config) -> None:
    handle = JobHandle(kind="vertex-custom-job", id="4411", name=VERTEX_JOB, location="us-central1",
                       url="https://console.cloud.google.com/vertex-ai/locations/us-central1/training/4411")
    monkeypatch.setattr("gpuflow.steps.export.export_model", lambda *args: {
        "job": handle.to_xcom(), "state_dict_uri": "gs://b/m/state_dict.pt", "model_dir_uri": "gs://b/m",
        "model": config.model.name})


def start_build(cloud, monkeypatch, config) -> None:
    cloud.build.statuses = [cloudbuild_v1.Build.Status.WORKING]  # it builds until cancelled
    handle = JobHandle(kind="cloud-build", id="b7e1c0de", name="b7e1c0de", location="us-central1",
                       url="https://console.cloud.google.com/cloud-build/builds;region=us-central1/b7e1c0de")
    monkeypatch.setattr("gpuflow.steps.container.build_container",
                        lambda *args: {"job": handle.to_xcom(), "image": "us-central1-docker.pkg.dev/p/r/i:t"})


def start_dataflow_placement(cloud, monkeypatch, config) -> None:
    handle = cloud.dataflow.scripted_job(NEVER_ENDS)
    monkeypatch.setattr("gpuflow.steps.launch.start_next_placement",
                        lambda *args, **kwargs: (Placement(number=1, total=1, config=config), handle))


def start_gpu_check(cloud, monkeypatch, config) -> None:
    from gpuflow.platform import get_platform

    handle = cloud.dataflow.scripted_job(NEVER_ENDS, streaming=False)
    platform_class = type(get_platform(config))
    monkeypatch.setattr(platform_class, "find_gpu_check", lambda self, names: None)
    monkeypatch.setattr(platform_class, "start_gpu_check", lambda self, names, image: handle)


def vertex_cancels(cloud) -> list[str]:
    return [request.name for name, request in cloud.vertex.requests if name == "cancel_custom_job"]


def build_cancels(cloud) -> list[str]:
    return [request.id for name, request in cloud.build.requests if name == "cancel_build"]


def dataflow_cancels(cloud) -> list[str]:
    return [request.job_id for request in cloud.dataflow.calls("update_job")
            if JobState(request.job.requested_state) == dataflow_v1beta3.JobState.JOB_STATE_CANCELLED]


def vertex_polls(cloud) -> int:
    return sum(name == "get_custom_job" for name, _ in cloud.vertex.requests)


def build_polls(cloud) -> int:
    return sum(name == "get_build" for name, _ in cloud.build.requests)


def dataflow_polls(cloud) -> int:
    return len(cloud.dataflow.calls("get_job"))


#: operator class -> (how its job starts, how many polls of the job the fakes saw, the cancels they saw, the job)
OPERATORS = {
    ExportModelOperator: (start_export, vertex_polls, vertex_cancels, VERTEX_JOB),
    BuildContainerOperator: (start_build, build_polls, build_cancels, "b7e1c0de"),
    VerifyGpuOperator: (start_gpu_check, dataflow_polls, dataflow_cancels, "job-1"),
    LaunchPipelineOperator: (start_dataflow_placement, dataflow_polls, dataflow_cancels, "job-1"),
    RunBatchOperator: (start_dataflow_placement, dataflow_polls, dataflow_cancels, "job-1"),
}


@pytest.mark.parametrize("deferrable", [True, False], ids=["deferred", "waiting-in-worker"])
@pytest.mark.parametrize("operator_class", list(OPERATORS), ids=lambda cls: cls.__name__)
def test_a_kill_cancels_the_job_deferred_or_waiting_in_the_worker(cloud, monkeypatch, operator_class, deferrable):
    start, polls, cancels, job = OPERATORS[operator_class]
    config = gcp_test_config("dataflow.poll_interval_s=0.01")
    start(cloud, monkeypatch, config)
    with DAG("kill_test", schedule=None) as dag:
        operator = operator_class(task_id="waits", config_json=config.model_dump(mode="json"),
                                  deferrable=deferrable)
    context = {"ti": RecordingTI(), "dag": dag, "run_id": "manual__2026-12-04T00:00:00+00:00",
               "outlet_events": {}}

    if deferrable:
        with pytest.raises(TaskDeferred) as deferred:
            operator.execute(context)
        assert cancels(cloud) == []
        asyncio.run(deferred.value.trigger.on_kill())  # the task is killed while the triggerer waits
    else:
        ended: list[BaseException | None] = []

        def run() -> None:
            try:
                operator.execute(context)
            except BaseException as error:  # the job's end, once cancelled, fails the task
                ended.append(error)
            else:
                ended.append(None)

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        wait_until(lambda: polls(cloud) >= 2, "the worker's wait to poll the job")
        assert cancels(cloud) == [] and not ended
        operator.on_kill()  # the task is killed while its worker waits
        worker.join(timeout=60)
        assert not worker.is_alive() and ended and ended[0] is not None
    assert cancels(cloud) == [job]
