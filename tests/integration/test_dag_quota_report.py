"""gpu_quota_report with the real Airflow: local profile for real, gcp profile with the Compute client faked."""

import pytest
from airflow.utils.state import DagRunState

from tests.gcp_fakes import FakeGoogleCloud, FakeProjectsClient, FakeRegionsClient


def quota_dag(config_file: str | None = None):
    from tests.helpers import dag_bag, site_config, site_dag

    if config_file is None:
        return dag_bag().dags["gpu_quota_report"]
    return site_dag(site_config("gcp-example.yaml", config_file), "gpu_quota_report")


def report_of(run):
    (ti,) = [ti for ti in run.get_task_instances() if ti.task_id == "report"]
    return ti.xcom_pull(task_ids="report")


def test_local_profile_reports_this_machines_gpus(airflow_db):
    run = quota_dag().test()
    assert run.state == DagRunState.SUCCESS
    assert report_of(run)["profile"] == "local"


def test_gcp_profile_reads_regional_quota(airflow_db, monkeypatch):
    client = FakeRegionsClient({"us-central1": [("NVIDIA_L4_GPUS", 4, 4)]})
    projects = FakeProjectsClient((("GPUS_ALL_REGIONS", 8, 1),))
    cloud = FakeGoogleCloud(regions=client, projects=projects).install(monkeypatch)  # under gpuflow's client factory
    run = quota_dag("configs/gcp.example.yaml").test()
    assert run.state == DagRunState.SUCCESS
    regional, project_wide = report_of(run)["readings"]
    assert (regional["metric"], regional["headroom"], regional["enough"]) == ("NVIDIA_L4_GPUS", 0.0, False)
    assert (project_wide["region"], project_wide["metric"], project_wide["headroom"]) == ("global", "GPUS_ALL_REGIONS", 7.0)
    assert client.requests[0].project == "my-gcp-project"
    assert {name for name, _ in cloud.clients_made} >= {"RegionsClient", "ProjectsClient"}


def test_two_sites_each_read_their_own_project_only(airflow_db, monkeypatch):
    """One Airflow, two teams' site files: each site's DAG asks Google about its own project, whatever the other's
    says, and its run's conf cannot point it elsewhere (a configuration file it names is refused at trigger)."""
    from airflow.sdk.definitions.param import ParamValidationError  # (where both tested lines have it)

    from tests.helpers import site_config, site_dag

    client = FakeRegionsClient({"us-central1": [("NVIDIA_L4_GPUS", 4, 0)]})
    projects = FakeProjectsClient((("GPUS_ALL_REGIONS", 8, 1),))
    FakeGoogleCloud(regions=client, projects=projects).install(monkeypatch)
    files = {team: site_config(f"{team}.yaml", "configs/gcp.example.yaml", project=f"{team}-ml-prod")
             for team in ("acme", "beta")}
    for team, config_file in files.items():
        dag = site_dag(config_file, "gpu_quota_report")
        assert dag.dag_id == f"{team}__gpu_quota_report" and f"site:{team}" in dag.tags
        client.requests.clear()
        run = dag.test()
        assert run.state == DagRunState.SUCCESS
        assert {request.project for request in client.requests} == {f"{team}-ml-prod"}
    with pytest.raises(ParamValidationError, match="config_file"):
        site_dag(files["acme"], "gpu_quota_report").test(run_conf={"config_file": files["beta"]})
