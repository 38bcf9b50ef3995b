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
    def __init__(self):
        self.cancelled, self.deleted = [], []
        self.transport = SimpleNamespace(operations_client=SimpleNamespace(cancel_operation=self.cancel))

    def cancel(self, name):
        self.cancelled.append(name)

    def delete_batch(self, request, retry=None, timeout=None, metadata=()):
        raise NotFound(f"Batch {request['name']} not found")


def test_on_kill_cancels_the_batch_operation(monkeypatch):
    from airflow.providers.google.cloud.hooks.dataproc import DataprocHook

    client = FakeBatchClient()
    monkeypatch.setattr(DataprocHook, "get_batch_client", lambda self, region=None: client)
    operator = DataprocBatchOperator(task_id="batch")
    operator._config = CONFIG
    operator._operation_name = "projects/my-project-1/regions/us-central1/operations/op-7"
    operator.on_kill()
    assert client.cancelled == ["projects/my-project-1/regions/us-central1/operations/op-7"]


def test_cancel_on_kill_false_leaves_the_batch_running(monkeypatch):
    from airflow.providers.google.cloud.hooks.dataproc import DataprocHook

    client = FakeBatchClient()
    monkeypatch.setattr(DataprocHook, "get_batch_client", lambda self, region=None: client)
    operator = DataprocBatchOperator(task_id="batch", cancel_on_kill=False)
    operator._config = CONFIG
    operator._operation_name = "projects/my-project-1/regions/us-central1/operations/op-7"
    operator.on_kill()
    assert client.cancelled == []


def test_deleting_a_batch_that_is_not_there_is_fine(monkeypatch):
    from airflow.providers.google.cloud.hooks.dataproc import DataprocHook

    monkeypatch.setattr(DataprocHook, "get_batch_client", lambda self, region=None: FakeBatchClient())
    assert delete_gcp_batch(CONFIG, "gf-1-gpu-batch") is False
