"""dataproc_gpu_batch with the real Airflow: local Spark for real; Dataproc faked at its client boundary."""

import asyncio
from types import SimpleNamespace

import pytest
from airflow.utils.state import DagRunState, TaskInstanceState
from google.cloud import dataproc_v1

from gpuflow.dataproc.serverless import batch_id_for
from gpuflow.platform.emulators import LOCAL_CONN_ID
from gpuflow.runs.naming import run_prefix

DAG_ID = "dataproc_gpu_batch"
BUCKET = "gpuflow-dataproc-test"


def dataproc_dag(config_file):
    from tests.helpers import site_dag

    return site_dag(config_file, DAG_ID)


def states(run):
    return {ti.task_id: ti.state for ti in run.get_task_instances()}


def batch_result(run):
    (ti,) = [ti for ti in run.get_task_instances() if ti.task_id == "batch"]
    return ti.xcom_pull(task_ids="batch")


def test_local_profile_runs_the_real_pyspark_job(airflow_db):
    from tests.helpers import site_config

    # The job's arguments are the site's: a run's conf may not pass arguments to code (gpuflow.runs.run_policy).
    config_file = site_config("dataproc-local.yaml", "configs/dataproc.example.yaml",
                              **{"profile": "local", "dataproc.args": ["--rows", "200000"]})
    run = dataproc_dag(config_file).test()
    assert run.state == DagRunState.SUCCESS, states(run)
    result = batch_result(run)
    assert result["joined_rows"] == 200000
    assert result["accelerator_count"] == 0  # no GPU here: a count of 0 and a note, not a crash
    assert "nvidia-smi not found" in result["notes"][0]


class FakeBatchController:
    """Answers like Dataproc's BatchControllerClient: PENDING, RUNNING, then the final state."""

    def __init__(self, final_state, state_message, output_uri):
        self.states = [dataproc_v1.Batch.State.PENDING, dataproc_v1.Batch.State.RUNNING, final_state]
        self.state_message, self.output_uri = state_message, output_uri
        self.created, self.deleted, self.cancelled = [], [], []
        self.transport = SimpleNamespace(operations_client=SimpleNamespace(cancel_operation=self.cancel_operation))

    def create_batch(self, request, retry=None, timeout=None, metadata=()):
        assert isinstance(request["batch"], dataproc_v1.Batch)
        self.created.append(request)
        # google.api_core's Operation: its name, and its BatchOperationMetadata naming the batch
        return SimpleNamespace(operation=SimpleNamespace(name=self._operation(request["parent"])),
                               metadata=dataproc_v1.BatchOperationMetadata(
                                   batch=f"{request['parent']}/batches/{request['batch_id']}"))

    @staticmethod
    def _operation(parent: str) -> str:
        return f"{parent}/operations/op-1"

    def get_batch(self, request, retry=None, timeout=None, metadata=()):
        state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        # The batch names the operation that created it (Batch.operation), under the create request's parent.
        (parent,) = [r["parent"] for r in self.created if request["name"].endswith(f"/batches/{r['batch_id']}")]
        return dataproc_v1.Batch(name=request["name"], state=state, state_message=self.state_message,
                                 operation=self._operation(parent),
                                 runtime_info=dataproc_v1.RuntimeInfo(output_uri=self.output_uri))

    def cancel_operation(self, name, **kwargs):
        """Dataproc cancels the batch: it ends CANCELLED."""
        assert name in [self._operation(r["parent"]) for r in self.created], name
        self.cancelled.append(name)
        self.states = [dataproc_v1.Batch.State.CANCELLED]

    def delete_batch(self, request, retry=None, timeout=None, metadata=()):
        self.deleted.append(request["name"])


@pytest.fixture
def gcp_dataproc(emulators, monkeypatch):
    """The Dataproc client faked; GCS (staging, driver output) is the real emulator. Preflight's reads of the project
    (Compute Engine's zones, Service Usage, IAM, organization policies) get the fake Google Cloud's answers: nothing
    here may reach Google."""
    from airflow.providers.google.cloud.hooks.dataproc import DataprocAsyncHook, DataprocHook
    from airflow.providers.google.cloud.hooks.gcs import GCSHook

    from tests.gcp_fakes import FakeGoogleCloud

    FakeGoogleCloud().install(monkeypatch)

    gcs = GCSHook(gcp_conn_id=LOCAL_CONN_ID)
    if not gcs.get_conn().bucket(BUCKET).exists():
        gcs.create_bucket(bucket_name=BUCKET, project_id="gpuflow-dataproc-test")
    # The driver output as Dataproc writes it: <output_uri>.000000000 objects.
    gcs.upload(BUCKET, "driveroutput/out.000000000", data="Using Spark's default log4j profile\n"
               'GPUFLOW_RESULT {"accelerator_count": 2, "hosts": 2, "joined_rows": 10000000, "notes": []}\n')

    def install(final_state, message=""):
        fake = FakeBatchController(final_state, message, f"gs://{BUCKET}/driveroutput/out")
        monkeypatch.setattr(DataprocHook, "get_batch_client", lambda self, region=None: fake)

        async def batch_client(hook, region=None):  # the trigger's async hook reads the same fake
            return SimpleNamespace(get_batch=lambda **kwargs: asyncio.sleep(0, fake.get_batch(**kwargs)))

        monkeypatch.setattr(DataprocAsyncHook, "get_batch_client", batch_client)
        return fake

    return install


def gcp_conf():
    """The profile, project, bucket, connection and poll interval are the site's (no form shows a poll interval)."""
    from tests.helpers import site_config

    return {"config_file": site_config("dataproc-gcp.yaml", "configs/dataproc.example.yaml", profile="gcp",
                                       project="gpuflow-dataproc-test", bucket=BUCKET, gcp_conn_id=LOCAL_CONN_ID,
                                       **{"dataproc.poll_interval_s": 0.1, "limits.min_poll_interval_s": 0.1})}


@pytest.mark.parametrize("deferrable", [True, False], ids=["deferred", "waiting-in-worker"])
def test_gcp_profile_submits_waits_returns_the_gpu_count_and_deletes(airflow_db, gcp_dataproc, monkeypatch,
                                                                     deferrable):
    """Deferred or waiting in its worker slot (``[operators] default_deferrable``), the same request and result."""
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", str(deferrable))
    fake = gcp_dataproc(dataproc_v1.Batch.State.SUCCEEDED)
    dag = dataproc_dag(gcp_conf()["config_file"])
    assert dag.task_dict["batch"].deferrable is deferrable
    run = dag.test()
    assert run.state == DagRunState.SUCCESS, states(run)
    assert batch_result(run)["accelerator_count"] == 2
    (request,) = fake.created
    batch_id = batch_id_for(run_prefix(run.dag_id, run.run_id))
    assert request["batch_id"] == batch_id and request["parent"] == "projects/gpuflow-dataproc-test/regions/us-central1"
    properties = dict(request["batch"].runtime_config.properties)
    assert properties["spark.dataproc.executor.resource.accelerator.type"] == "l4"
    assert request["batch"].pyspark_batch.main_python_file_uri.startswith(f"gs://{BUCKET}/gpuflow/")
    # the janitor's proof, beside the provider's own labels
    assert dict(request["batch"].labels) == {"gpuflow-run": run_prefix(run.dag_id, run.run_id),
                                             # the site's DAG id, as the provider writes it into a label
                                             "airflow-dag-id": "dataproc-gcp--dataproc-gpu-batch",
                                             "airflow-task-id": "batch",
                                             "airflow-dag-display-name": "dataproc-gcp--dataproc-gpu-batch"}
    assert fake.deleted == [f"projects/gpuflow-dataproc-test/locations/us-central1/batches/{batch_id}"]
    (ti,) = [ti for ti in run.get_task_instances() if ti.task_id == "batch"]
    # the provider's DataprocBatchLink, as Airflow stores it once the task ends: its URL
    assert ti.xcom_pull(task_ids="batch", key="dataproc_batch") == (
        f"https://console.cloud.google.com/dataproc/batches/us-central1/{batch_id}/monitoring?project=gpuflow-dataproc-test")


def test_a_retry_finds_the_runs_batch_and_waits_for_it(airflow_db, gcp_dataproc):
    """A second try of the same run: the create answers AlreadyExists, and the task waits for that batch."""
    from google.api_core.exceptions import AlreadyExists

    fake = gcp_dataproc(dataproc_v1.Batch.State.SUCCEEDED)
    first_try = fake.create_batch

    def create_batch(request, **kwargs):
        if fake.created:
            raise AlreadyExists(f"Batch {request['parent']}/batches/{request['batch_id']} already exists")
        return first_try(request, **kwargs)

    fake.create_batch = create_batch
    from gpuflow.configuration.loading import load_config
    from gpuflow.operators.dataproc import DataprocBatchOperator

    config = load_config(gcp_conf()["config_file"]).model_dump(mode="json")
    results = []
    for _ in range(2):
        operator = DataprocBatchOperator(task_id="batch", config_json=config, deferrable=False,
                                         polling_interval_seconds=0.05)
        results.append(operator.execute(kill_context(operator)))
    assert len(fake.created) == 1 and results[0] == results[1] and results[1]["accelerator_count"] == 2


def test_gcp_failure_still_cleans_up_and_the_run_fails(airflow_db, gcp_dataproc):
    fake = gcp_dataproc(dataproc_v1.Batch.State.FAILED,
                        "Constraint constraints/compute.requireShieldedVm violated for project gpuflow-dataproc-test.")
    run = dataproc_dag(gcp_conf()["config_file"]).test()
    assert run.state == DagRunState.FAILED
    assert states(run)["batch"] == TaskInstanceState.FAILED
    assert states(run)["cleanup"] == TaskInstanceState.SUCCESS
    assert len(fake.deleted) == 1


@pytest.mark.parametrize("deferrable", [True, False], ids=["deferred", "waiting-in-worker"])
def test_gcp_a_kill_cancels_the_batch_deferred_or_waiting_in_the_worker(airflow_db, gcp_dataproc, deferrable):
    """Deferred, the trigger's on_kill (the 3.3 triggerer calls it); waiting in its worker, the operator's own."""
    import threading

    from airflow.sdk import DAG

    try:
        from airflow.sdk.exceptions import TaskDeferred
    except ImportError:  # Airflow 3.1, Composer's floor (make test-composer LINE=3.1.8)
        from airflow.exceptions import TaskDeferred

    from gpuflow.configuration.loading import load_config
    from gpuflow.operators.airflow_names import AirflowFailException
    from gpuflow.operators.dataproc import DataprocBatchOperator
    from tests.helpers import wait_until

    fake = gcp_dataproc(dataproc_v1.Batch.State.SUCCEEDED)
    fake.states = [dataproc_v1.Batch.State.RUNNING]  # it runs until cancelled
    config = load_config(gcp_conf()["config_file"])
    with DAG("dataproc_kill", schedule=None):
        operator = DataprocBatchOperator(task_id="batch", config_json=config.model_dump(mode="json"),
                                         deferrable=deferrable, polling_interval_seconds=0.05)
    context = kill_context(operator)
    if deferrable:
        with pytest.raises(TaskDeferred) as deferred:
            operator.execute(context)
        assert fake.cancelled == []
        asyncio.run(deferred.value.trigger.on_kill())
    else:
        ended = []
        worker = threading.Thread(target=lambda: ended.append(
            pytest.raises(AirflowFailException, operator.execute, context)), daemon=True)
        worker.start()
        wait_until(lambda: fake.created, "the batch's creation", 30)  # then it waits
        assert fake.created and fake.cancelled == []
        operator.on_kill()
        worker.join(timeout=30)
        assert not worker.is_alive() and "CANCELLED" in str(ended[0].value)  # the wait ended with the cancel
    (created,) = fake.created
    assert fake.cancelled == [f"{created['parent']}/operations/op-1"]


def kill_context(operator):
    """What the batch task's execute reads of a context, for a task run outside a DAG run."""
    from airflow.sdk import DAG

    dag = operator.dag if operator.has_dag() else DAG("dataproc_direct", schedule=None)
    return {"ti": SimpleNamespace(xcom_push=lambda key, value: None), "dag": dag,
            "run_id": "manual__2026-12-04T00:00:00+00:00"}
