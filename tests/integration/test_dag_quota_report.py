"""gpu_quota_report with the real Airflow: local profile for real, gcp profile with the Compute client faked."""

from airflow.utils.state import DagRunState

from tests.gcp_fakes import FakeGoogleCloud, FakeProjectsClient, FakeRegionsClient


def quota_dag():
    from tests.helpers import dag_bag

    return dag_bag().dags["gpu_quota_report"]


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
    run = quota_dag().test(run_conf={"config_file": "configs/gcp.example.yaml"})
    assert run.state == DagRunState.SUCCESS
    regional, project_wide = report_of(run)["readings"]
    assert (regional["metric"], regional["headroom"], regional["enough"]) == ("NVIDIA_L4_GPUS", 0.0, False)
    assert (project_wide["region"], project_wide["metric"], project_wide["headroom"]) == ("global", "GPUS_ALL_REGIONS", 7.0)
    assert client.requests[0].project == "my-gcp-project"
    assert {name for name, _ in cloud.clients_made} >= {"RegionsClient", "ProjectsClient"}
