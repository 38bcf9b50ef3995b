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



def hostile_confs(targets) -> list[tuple[str, str, str | None, dict]]:
    """(class, DAG, the site file whose DAG runs it (None: the repository's own DAG), conf): one or more per class
    of escalation."""
    from tests.helpers import local_site_file

    site = local_site_file()
    return [
        ("code", DATAPROC, None, {"dataproc__main_python_file": str(targets["script"])}),
        ("code", DATAPROC, None, {"dataproc__args": ["--rows", "1"]}),
        ("code", STREAMING, site, {"container__image": "docker.io/evil/worker:latest"}),
        ("code", STREAMING, site, {"model__name": str(targets["team"])}),
        ("identity", STREAMING, site, {"gcp_conn_id": "another_teams_admin"}),
        ("identity", STREAMING, site, {"impersonation_chain": ["admin@another-team.iam.gserviceaccount.com"]}),
        # A configuration file of the run's choosing: another team's, one outside the site folder, a path out.
        # The form's field offers the site's file alone, so the Params' schema refuses each.
        ("paths", STREAMING, site, {"config_file": targets["limited_site"]}),
        ("paths", STREAMING, site, {"config_file": str(targets["outside"])}),
        ("paths", STREAMING, site, {"config_file": "configs/../../../etc/passwd"}),
        ("deletion", BATCH, site, {"batch__output": f"{targets['team']}/"}),
        ("deletion", STREAMING, site, {"bucket": "another-teams-bucket"}),
        ("deletion", STREAMING, site, {"local__state_dir": str(targets["team"])}),
        ("names", STREAMING, site, {"deployment__name": "prod eu; touch /tmp/owned"}),
        ("region", STREAMING, site, {"region": "us central1"}),  # the file's region alone (no limits.regions)
        ("quoting", STREAMING, site, {"gpu__zone": "us-central1-a; touch /tmp/owned"}),
        ("size", BATCH, site, {"batch__input": "/tmp/gpuflow/{ds:>999999999}"}),
        # A section as one key: the standard library's timeit runs the statement it is given.
        ("section", DATAPROC, None, {"dataproc": {"main_python_file": timeit.__file__,
                                                  "args": ["-n1", targets["statement"]]}}),
        ("section", STREAMING, site, {"local": {"runner": "DataflowRunner"}}),
        # A key that carries '=' once became a line of YAML.
        ("yaml", STREAMING, site, {"gcp_conn_id=another_teams_conn #": None, "project=another-project #": None}),
        # Globs and prefixes that reach gpuflow's own folder, by wildcard or inside a segment.
        ("glob", BATCH, site, {"batch__input": f"{targets['state']}/gpuflo[w]/deployments/**"}),
        ("glob", BATCH, site, {"batch__input": f"{targets['state']}/**"}),
        ("segment", STREAMING, targets["gcs_site"], {"export__model_dir": "gs://team-bucket/gpuflow"}),
        # Cost: no limit in the file lets a run raise its workers or GPUs; a lasting deployment needs the site's yes.
        ("cost", STREAMING, site, {"worker__max_num_workers": 1000, "gpu__count": 8}),
        ("cost", STREAMING, site, {"deployment__mode": "persistent"}),
        ("cost", STREAMING, targets["limited_site"], {"worker__max_num_workers": 1000}),
        # Format characters that make a log line read differently from what it is.
        ("format", BATCH, site, {"batch__output": f"{targets['state']}/answers\u202e/"}),
        ("format", STREAMING, site, {"model__name": "gpuflow-demo\u200b"}),
    ]


CASES = [(kind, dag_id, index) for index, (kind, dag_id, _, _) in enumerate(hostile_confs(
    {"marker": "m", "script": "s", "team": "t", "outside": "o", "statement": "s", "state": "/tmp",
     "gcs_site": "g", "limited_site": "l"}))]


@pytest.mark.parametrize(("kind", "dag_id", "index"), CASES, ids=[f"{k}-{d}-{i}" for k, d, i in CASES])
def test_a_hostile_conf_fails_preflight_and_leaves_its_target(bag, local_config, emulators, targets, kind, dag_id,
                                                              index, capfd):
    from airflow.sdk.definitions.param import ParamValidationError  # (where both tested lines have it)

    from gpuflow.platform.emulators import LOCAL_CONN_ID, emulator_environment
    from gpuflow.steps.resources import list_run_resources
    from tests.helpers import site_dag

    _, _, site_file, conf = hostile_confs(targets)[index]
    dag = bag.dags[dag_id] if site_file is None else site_dag(site_file, dag_id)
    dates = {"logical_date": pendulum.datetime(2026, 5, 1, tz="UTC")} if dag_id == BATCH else {}
    # What the Params' schema can say, it says: a configuration file other than the DAG's, a cost knob or a region
    # beyond the site's limits, a format character in a path. No run at all.
    schema_refuses = kind in ("paths", "cost", "region") or "\u202e" in str(conf.get("batch__output", ""))
    if schema_refuses:
        with pytest.raises(ParamValidationError, match="config_file|batch__output|__|param region"):
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
    names = resource_names(local_config, run_prefix(run.dag_id, run.run_id))
    with emulator_environment(local_config):
        assert list_run_resources(local_config, names, LOCAL_CONN_ID) == {"topics": [], "subscriptions": [],
                                                                          "buckets": []}
