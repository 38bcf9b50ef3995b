"""on_kill cancels the Dataproc operation; cleanup tolerates a batch that is not there."""

import json
from types import SimpleNamespace

import pytest
from google.api_core.exceptions import NotFound

from gpuflow.configuration.loading import load_config
from gpuflow.operators.dataproc import DataprocBatchOperator
from gpuflow.steps.dataproc_batch import delete_gcp_batch


@pytest.fixture(autouse=True)
def anonymous_connection(monkeypatch):
    """The hook needs a connection to exist; no credential is used, since the client is faked."""
    monkeypatch.setenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", json.dumps(
        {"conn_type": "google_cloud_platform", "extra": {"is_anonymous": True, "project": "my-project-1"}}))


CONFIG = load_config("configs/dataproc.example.yaml", overrides=["profile=gcp", "project=my-project-1"])


class FakeBatchClient:
    """Dataproc's BatchControllerClient: a batch names the operation that created it."""

    def __init__(self):
        self.cancelled, self.deleted = [], []
        self.transport = SimpleNamespace(operations_client=SimpleNamespace(cancel_operation=self.cancel))

    def get_batch(self, request, retry=None, timeout=None, metadata=()):
        from google.cloud import dataproc_v1

        parent = request["name"].split("/batches/")[0].replace("/locations/", "/regions/")
        return dataproc_v1.Batch(name=request["name"], operation=f"{parent}/operations/op-7")

    def cancel(self, name):
        self.cancelled.append(name)

    def delete_batch(self, request, retry=None, timeout=None, metadata=()):
        raise NotFound(f"Batch {request['name']} not found")


def team_batch_operator(**kwargs):
    """The operator as a team's DAG uses it: the provider's arguments, no gpuflow configuration."""
    return DataprocBatchOperator(task_id="batch", project_id="my-project-1", region="us-central1",
                                 batch={"pyspark_batch": {"main_python_file_uri": "gs://b/job.py"}},
                                 batch_id="gf-1-gpu-batch", **kwargs)


@pytest.mark.parametrize("cancel_on_kill", [True, False])
def test_on_kill_cancels_the_batch_by_its_id_unless_told_not_to(monkeypatch, cancel_on_kill):
    """Also a try that found its batch there (AlreadyExists) and so holds no operation of its own."""
    from airflow.providers.google.cloud.hooks.dataproc import DataprocHook

    client = FakeBatchClient()
    monkeypatch.setattr(DataprocHook, "get_batch_client", lambda self, region=None: client)
    operator = team_batch_operator(cancel_on_kill=cancel_on_kill)
    assert operator.operation is None
    operator.on_kill()
    assert client.cancelled == (["projects/my-project-1/regions/us-central1/operations/op-7"] if cancel_on_kill
                                else [])


def test_it_takes_a_configuration_or_the_providers_arguments_not_both(monkeypatch):
    with pytest.raises(TypeError, match="not both: region, batch"):
        team_batch_operator(config_json=CONFIG.model_dump(mode="json"))
    with pytest.raises(TypeError, match="needs config_json"):
        DataprocBatchOperator(task_id="batch", region="us-central1")
    assert team_batch_operator().deferrable is True  # the tests' [operators] default_deferrable
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "False")
    assert team_batch_operator().deferrable is False  # read when the task is built, not when the module loaded


def test_deleting_a_batch_that_is_not_there_is_fine(monkeypatch):
    from airflow.providers.google.cloud.hooks.dataproc import DataprocHook

    monkeypatch.setattr(DataprocHook, "get_batch_client", lambda self, region=None: FakeBatchClient())
    assert delete_gcp_batch(CONFIG, "gf-1-gpu-batch") is False
