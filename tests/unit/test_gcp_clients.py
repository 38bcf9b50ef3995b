"""The real GcpClients reads the Airflow connection as the provider's GoogleBaseHook does."""

import json

import pytest

from gpuflow.platform.gcp_clients import GcpClients


@pytest.mark.parametrize(("extra", "chain"), [
    ({"project": "p", "impersonation_chain": "deployer@p.iam.gserviceaccount.com, gpuflow@p.iam.gserviceaccount.com"},
     ["deployer@p.iam.gserviceaccount.com", "gpuflow@p.iam.gserviceaccount.com"]),
    ({"project": "p", "impersonation_chain": "gpuflow@p.iam.gserviceaccount.com"}, ["gpuflow@p.iam.gserviceaccount.com"]),
    ({"project": "p"}, []),
])
def test_the_impersonation_chain_comes_from_the_connection_extra(monkeypatch, extra, chain):
    connection = {"conn_type": "google_cloud_platform", "extra": extra}
    monkeypatch.setenv("AIRFLOW_CONN_GPUFLOW_CHAIN_TEST", json.dumps(connection))
    assert GcpClients("gpuflow_chain_test").impersonation_chain() == chain
