"""Hostile confs through the real Airflow (dag.test()): a run's conf is untrusted input (gpuflow.runs.run_policy). Each is
refused in preflight, before anything is created, and its target is left as it was: the marker a code injection
would write does not exist, the folder a publish would empty still holds its files, nothing of the run exists."""

from __future__ import annotations

import timeit

import pendulum
import pytest
from airflow.utils.state import DagRunState, TaskInstanceState

from gpuflow.runs.naming import resource_names, run_prefix

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

STREAMING, BATCH, DATAPROC = "llm_streaming_inference", "llm_batch_inference", "dataproc_gpu_batch"
SECRET = "hunter2-never-in-a-log"


@pytest.fixture(scope="module")
def bag(airflow_db):
    from tests.helpers import dag_bag

    return dag_bag()


@pytest.fixture
def targets(tmp_path, local_config):
    """What the hostile confs aim at: a script that would leave a marker, a team's folder of files, a file with a
    secret outside configs/ and the site folder."""
    marker = tmp_path / "owned"
    script = tmp_path / "payload.py"
    script.write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    team = tmp_path / "team-folder"
    team.mkdir()
    (team / "quarterly.csv").write_text("a,b\n")
    outside = tmp_path / "outside.yaml"
    outside.write_text(f"project: my-project\npassword: {SECRET}\nbad: [\n")
    from tests.helpers import local_site_file, site_config

    return {"marker": marker, "script": script, "team": team, "outside": outside,
            "statement": f"open({str(marker)!r}, 'w').write('ran')",
            "state": local_config.local.state_dir,
            "gcs_site": site_config("policy-gcs.yaml", local_site_file(), bucket="team-bucket"),
            "limited_site": site_config("policy-limited.yaml", local_site_file(), **{
                "limits.max_gpus": 2, "gpu.type": "nvidia-l4"})}



def hostile_confs(targets) -> list[tuple[str, str, dict]]:
    """(class, DAG, conf): one or more per class of escalation."""
    from tests.helpers import local_site_file

    site = local_site_file()
    return [
        ("code", DATAPROC, {"dataproc__main_python_file": str(targets["script"])}),
        ("code", DATAPROC, {"dataproc__args": ["--rows", "1"], "config_file": site}),
        ("code", STREAMING, {"config_file": site, "container__image": "docker.io/evil/worker:latest"}),
        ("code", STREAMING, {"config_file": site, "model__name": str(targets["team"])}),
        ("identity", STREAMING, {"config_file": site, "gcp_conn_id": "another_teams_admin"}),
        ("identity", STREAMING, {"config_file": site,
                                 "impersonation_chain": ["admin@another-team.iam.gserviceaccount.com"]}),
        ("paths", STREAMING, {"config_file": str(targets["outside"])}),
        ("paths", STREAMING, {"config_file": "configs/../../../etc/passwd"}),  # the Param's pattern refuses it
        ("deletion", BATCH, {"config_file": site, "batch__output": f"{targets['team']}/"}),
        ("deletion", STREAMING, {"config_file": site, "bucket": "another-teams-bucket"}),
        ("deletion", STREAMING, {"config_file": site, "local__state_dir": str(targets["team"])}),
        ("names", STREAMING, {"config_file": site, "region": "us central1"}),
        ("quoting", STREAMING, {"config_file": site, "gpu__zone": "us-central1-a; touch /tmp/owned"}),
        ("size", BATCH, {"config_file": site, "batch__input": "/tmp/gpuflow/{ds:>999999999}"}),
        # A section as one key: the standard library's timeit runs the statement it is given.
        ("section", DATAPROC, {"dataproc": {"main_python_file": timeit.__file__,
                                            "args": ["-n1", targets["statement"]]}}),
        ("section", STREAMING, {"config_file": site, "local": {"runner": "DataflowRunner"}}),
        # A key that carries '=' once became a line of YAML.
        ("yaml", STREAMING, {"config_file": site, "gcp_conn_id=another_teams_conn #": None,
                             "project=another-project #": None}),
        # Globs and prefixes that reach gpuflow's own folder, by wildcard or inside a segment.
        ("glob", BATCH, {"config_file": site, "batch__input": f"{targets['state']}/gpuflo[w]/deployments/**"}),
        ("glob", BATCH, {"config_file": site, "batch__input": f"{targets['state']}/**"}),
        ("segment", STREAMING, {"config_file": targets["gcs_site"], "export__model_dir": "gs://team-bucket/gpuflow"}),
        # Cost: no limit in the file lets a run raise its workers or GPUs; a lasting deployment needs the site's yes.
        ("cost", STREAMING, {"config_file": site, "worker__max_num_workers": 1000, "gpu__count": 8}),
        ("cost", STREAMING, {"config_file": site, "deployment__mode": "persistent"}),
        ("cost", STREAMING, {"config_file": targets["limited_site"], "worker__max_num_workers": 1000}),
        # Format characters that make a log line read differently from what it is.
        ("format", BATCH, {"config_file": site, "batch__output": f"{targets['state']}/answers\u202e/"}),
        ("format", STREAMING, {"config_file": site, "model__name": "gpuflow-demo\u200b"}),
    ]


CASES = [(kind, dag_id, index) for index, (kind, dag_id, _) in enumerate(hostile_confs(
    {"marker": "m", "script": "s", "team": "t", "outside": "o", "statement": "s", "state": "/tmp",
     "gcs_site": "g", "limited_site": "l"}))]


@pytest.mark.parametrize(("kind", "dag_id", "index"), CASES, ids=[f"{k}-{d}-{i}" for k, d, i in CASES])
def test_a_hostile_conf_fails_preflight_and_leaves_its_target(bag, local_config, emulators, targets, kind, dag_id,
                                                              index, capfd):
    from airflow.sdk.exceptions import ParamValidationError

    from gpuflow.platform.emulators import LOCAL_CONN_ID, emulator_environment
    from gpuflow.steps.resources import list_run_resources

    _, _, conf = hostile_confs(targets)[index]
    dag = bag.dags[dag_id]
    dates = {"logical_date": pendulum.datetime(2026, 5, 1, tz="UTC")} if dag_id == BATCH else {}
    schema_refuses = ".." in str(conf.get("config_file", "")) or "\u202e" in str(conf.get("batch__output", ""))
    if schema_refuses:  # what the Params' schema can say, it says: no run at all
        with pytest.raises(ParamValidationError, match="config_file|batch__output"):
            dag.test(run_conf=conf, **dates)
        assert not targets["marker"].exists()
        return
    run = dag.test(run_conf=conf, **dates)
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert run.state == DagRunState.FAILED, states
    assert states["preflight"] == TaskInstanceState.FAILED, states
    # Nothing but preflight and the always-run cleanup ran; every task that makes something never started.
    assert {task for task, state in states.items() if state == TaskInstanceState.SUCCESS} <= {"cleanup"}, states
    assert not targets["marker"].exists()
    assert sorted(p.name for p in targets["team"].iterdir()) == ["quarterly.csv"]
    out, err = capfd.readouterr()
    said = out + err
    assert any(words in said for words in ("only the configuration file", "does not declare", "config_file",
                                           "Invalid gpuflow configuration", "would raise this run's cost",
                                           "limits.max_gpus", "format character", "not among the models")),\
        said[-3000:]
    assert "another_teams_conn" not in said or "does not declare" in said  # named as refused, never used
    assert SECRET not in said
    names = resource_names(local_config, run_prefix(dag_id, run.run_id))
    with emulator_environment(local_config):
        assert list_run_resources(local_config, names, LOCAL_CONN_ID) == {"topics": [], "subscriptions": [],
                                                                          "buckets": []}
