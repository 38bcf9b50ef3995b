"""llm_streaming_inference triggered the way a person does: through Airflow 3's REST API, run by the real
scheduler (LocalExecutor) from DAGs parsed by the real dag-processor, with the real triggerer holding the deferred
waits, on the local profile's emulators."""

import json
import os
import re
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.helpers import ROOT
from tests.live_airflow import USERNAME, LiveAirflow, database_name

#: The sites the live Airflow serves (tests.helpers.site_config writes their files): the tests' local site, and the
#: site of the lasting deployment the browser test makes and rolls out (it allows lasting deployments and serves a
#: model of the test's own). Each has its DAG folder, as ``gpuflow site-dags`` writes it.
LOCAL_SITE, ROLLOUT_SITE = "local", "live-rollout"
DAG_ID = f"{LOCAL_SITE}__llm_streaming_inference"
ROLLOUT_DAG = f"{ROLLOUT_SITE}__llm_streaming_inference"


def bundles(site_dags: Path) -> str:
    """gpuflow's dags/ (the repository's own local DAGs: dataproc_gpu_batch on configs/dataproc.example.yaml), the
    sites' DAG folders, and tests/dags/ (quick_deferrals), each a DAG bundle of its own."""
    local = "airflow.dag_processing.bundles.local.LocalDagBundle"
    return json.dumps([
        {"name": "dags-folder", "classpath": local, "kwargs": {}},
        {"name": "gpuflow-sites", "classpath": local, "kwargs": {"path": str(site_dags)}},
        {"name": "test-dags", "classpath": local, "kwargs": {"path": str(ROOT / "tests" / "dags")}}])


@pytest.fixture(scope="module")
def rollout_model(tmp_path_factory) -> Path:
    """The model the rollout site serves; the browser test gives it new weights."""
    from gpuflow.platform.demo_model import write_demo_model

    return write_demo_model(tmp_path_factory.mktemp("live-rollout") / "model", seed=0)


@pytest.fixture(scope="module")
def airflow_live(tmp_path_factory, emulators, postgres_server, rollout_model):
    from gpuflow.sites import write_site_dag_file
    from tests.helpers import local_site_file

    home = tmp_path_factory.mktemp("airflow-live")
    site_dags = home / "site-dags"
    for site_file in (local_site_file(), rollout_site_file(rollout_model)):
        write_site_dag_file(Path(site_file), site_dags)
    live = LiveAirflow(home, postgres_server.database_url(database_name(home)),
                       extra_env={"AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": bundles(site_dags)})
    try:
        live.start()
        yield live
    finally:
        live.stop()


def local_conf(local_config):
    return {"model__max_new_tokens": 8, "smoke_test__num_prompts": 4}


#: What LocalProcessTrigger.on_kill logs, whether it stopped the pipeline or the run's cleanup (which the killed
#: task lets start at once) did so first.
KILLED = "task killed: "


def start_run(airflow_live, dag_id: str, conf: dict) -> str:
    """A manual run of ``dag_id`` with ``conf``, through the REST API: its run id."""
    answer = airflow_live.api("POST", f"/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf})
    assert answer.status_code == 200, answer.text
    return answer.json()["dag_run_id"]


def trigger_run(airflow_live, local_config) -> str:
    airflow_live.wait_for_dag(DAG_ID)
    return start_run(airflow_live, DAG_ID, local_conf(local_config))


def task_log(airflow_live, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
    return airflow_live.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}",
                            params={"full_content": True}).text


def trigger_logs(airflow_live, dag_id: str, run_id: str, task_id: str) -> str:
    """What the triggerer wrote for the task's triggers (attempt=N.log.trigger.ID.log beside the task's log)."""
    folder = airflow_live.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
    return "".join(path.read_text(errors="replace") for path in sorted(folder.glob("*.log.trigger.*")))


def wait_for_trigger_to_start(airflow_live, dag_id: str, run_id: str, task_id: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while "starting" not in trigger_logs(airflow_live, dag_id, run_id, task_id):
        assert time.monotonic() < deadline, f"no trigger of {task_id} started: {airflow_live.log_tail('triggerer')}"
        time.sleep(0.5)


def test_a_deferred_launch_marked_failed_stops_its_pipeline_once(airflow_live, local_config):
    """On every tested line: Airflow 3.3's triggerer calls the trigger's on_kill; 3.1's does not, and the trigger
    calls it itself once Airflow says the task left deferral (gpuflow.triggers.kill)."""
    run_id = trigger_run(airflow_live, local_config)
    airflow_live.wait_for_task_state(DAG_ID, run_id, "launch", "deferred", timeout_s=300)
    wait_for_trigger_to_start(airflow_live, DAG_ID, run_id, "launch")
    marked = airflow_live.api("PATCH", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/launch",
                              json={"new_state": "failed"})
    assert marked.status_code == 200, marked.text
    run = airflow_live.wait_for_run(DAG_ID, run_id, timeout_s=300)
    assert run["state"] == "failed"

    def logs() -> str:
        return trigger_logs(airflow_live, DAG_ID, run_id, "launch") + airflow_live.log_tail("triggerer", lines=10**6)

    # The 3.1 triggerer notices a task that left deferral at its next look at the database, which may come after
    # the run's cleanup has already ended the run.
    deadline = time.monotonic() + 120
    while KILLED not in logs():
        assert time.monotonic() < deadline, logs()[-4000:]
        time.sleep(1)
    assert logs().count(KILLED) == 1, logs()[-4000:]


#: The live Airflow's ``HOLD_S``: ``LiveAirflow`` leaves GPUFLOW_TRIGGER_SETTLE_S (0 in this process) out of its
#: processes' environment, so they hold for ``gpuflow.triggers.settle``'s default.
LIVE_HOLD_S = 20.0

#: What a gpuflow trigger logs when it starts (``gpuflow.triggers.settle.settled``), and when its event goes.
HOLDING = re.compile(r"holding events until (\S+) \(deferred at (\S+), (-?[\d.]+)s ago\)")
RELEASING = re.compile(r"releasing the event at (\S+) \((-?[\d.]+)s after the deferral\)")


def holds(logs: str) -> list[tuple[str, float, float, float]]:
    """Each trigger's start ("start", when its hold ends, when its task deferred, when it started) and each event's
    release ("release", when, when its task deferred, when), in the order logged, as epoch seconds."""
    found = []
    for line in logs.splitlines():
        if started := HOLDING.search(line):
            until, deferred = (datetime.fromisoformat(started[i]).timestamp() for i in (1, 2))
            found.append(("start", until, deferred, deferred + float(started[3])))
        elif released := RELEASING.search(line):
            at = datetime.fromisoformat(released[1]).timestamp()
            found.append(("release", at, at - float(released[2]), at))
    return found


def kill_the_triggerer_while_the_smoke_test_holds_its_answers(airflow_live, dag_id: str, run_id: str, count: int) -> None:
    """The smoke test's trigger pulls every answer and logs it, and its triggerer is SIGKILLed while the trigger
    holds its event, before it reaches the task. The hold ends ``HOLD_S`` after the deferral (the answers come
    within seconds of it: the kill lands in that window), and so does the next triggerer's, which rebuilds the
    trigger from its kwargs: its trigger gets the answers again after their ack deadline and fires its event no
    sooner than the deferral + ``HOLD_S``, but well before its own start + ``HOLD_S`` (it does not hold again)."""
    airflow_live.wait_for_task_state(dag_id, run_id, "smoke_test", "deferred", timeout_s=600)

    def logs() -> str:
        return trigger_logs(airflow_live, dag_id, run_id, "smoke_test")

    fired = logs().count("Trigger fired event")
    deadline = time.monotonic() + 120
    while logs().count(f"answered {count}/{count}") <= fired:
        assert time.monotonic() < deadline, airflow_live.log_tail("triggerer")
        time.sleep(0.1)
    before_kill = holds(logs())
    airflow_live.kill_and_replace("triggerer")
    # The killed trigger held its event: the kill landed while the answers were in its memory only.
    assert logs().count("Trigger fired event") == fired, (before_kill, logs()[-3000:])
    # The killed trigger: the latest deferral's (a rollout's smoke test defers once a round; log files of several
    # triggers are read in name order, not in time order).
    (_, until, deferred, _) = max((line for line in before_kill if line[0] == "start"), key=lambda line: line[2])
    assert until == pytest.approx(deferred + LIVE_HOLD_S, abs=0.01), before_kill
    deadline = time.monotonic() + 180
    while True:  # the next triggerer's: the rebuilt trigger's start, then its event's release
        after_kill = [line for line in holds(logs()) if line not in before_kill]
        starts, releases = ([line for line in after_kill if line[0] == kind] for kind in ("start", "release"))
        if starts and releases:
            break
        assert not releases and time.monotonic() < deadline, (after_kill, airflow_live.log_tail("triggerer"))
        time.sleep(0.2)
    (_, rebuilt_until, rebuilt_deferred, rebuilt_started) = min(starts, key=lambda line: line[3])
    released = min(line[1] for line in releases)
    window = {"deferred": deferred, "hold_until": until, "rebuilt_started": rebuilt_started, "released": released}
    # the same deferral, and the same hold: the restart neither extended nor shortened it
    assert rebuilt_deferred == pytest.approx(deferred, abs=0.002), (window, after_kill)
    assert rebuilt_until == pytest.approx(until, abs=0.01), (window, after_kill)
    assert released >= deferred + LIVE_HOLD_S - 0.05, window
    assert released <= rebuilt_started + LIVE_HOLD_S - 2, window  # it did not hold HOLD_S again from its start


def smoke_test_answers(airflow_live, dag_id: str, run_id: str) -> dict:
    """The smoke test's XCom after a run that succeeded with the smoke test at its first try."""
    run = airflow_live.wait_for_run(dag_id, run_id, timeout_s=600)
    smoke = airflow_live.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/smoke_test").json()
    assert run["state"] == "success" and smoke["try_number"] == 1, (run, smoke, airflow_live.log_tail("scheduler"))
    xcom = airflow_live.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/smoke_test/xcomEntries/"
                                   "return_value", params={"deserialize": True}).json()["value"]
    ids = [row["id"] for row in xcom["answers"]]
    assert xcom["answered"] == xcom["sent"] == len(ids) == len(set(ids)), xcom
    return xcom


def loses_its_triggerer_twice_and_answers_every_prompt_once(airflow_live, dag_id: str, run_id: str) -> None:
    """The run, deferring while its jobs start, loses its triggerer twice, as on Composer when pods move. Restarted
    while the launch is deferred: the new triggerer takes the wait over and the pipeline keeps running. SIGKILLed
    while the smoke test's trigger holds its answers: nothing had been acknowledged, so Pub/Sub resends the answers
    after their ack deadline to the next triggerer's trigger, which holds them only until HOLD_S after the deferral,
    not HOLD_S again. The run succeeds with every task at its first try, each prompt answered once. (The browser
    test's run goes through this: one run proves both, where two runs took about 90 s each.)"""
    airflow_live.wait_for_task_state(dag_id, run_id, "launch", "deferred", timeout_s=300)
    wait_for_trigger_to_start(airflow_live, dag_id, run_id, "launch")
    airflow_live.restart("triggerer")
    kill_the_triggerer_while_the_smoke_test_holds_its_answers(airflow_live, dag_id, run_id, 4)

    xcom = smoke_test_answers(airflow_live, dag_id, run_id)  # the run succeeded, the smoke test at its first try
    tis = airflow_live.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances").json()["task_instances"]
    assert {(ti["state"], ti["try_number"]) for ti in tis} == {("success", 1)}, tis
    # While the pipeline process loaded its model, the launch task gave its worker slot back: the triggerer
    # waited on it (LocalProcessTrigger), and the task resumed when the pipeline ran.
    launch_log = task_log(airflow_live, dag_id, run_id, "launch")
    assert "deferring until local-process" in launch_log and "the pipeline is running" in launch_log, launch_log[-2000:]
    assert KILLED not in trigger_logs(airflow_live, dag_id, run_id, "launch") + airflow_live.log_tail("triggerer", 10**6)
    assert xcom["sent"] == 4 and all(row["answer"] for row in xcom["answers"]), xcom
    # The killed trigger had every answer; the next one got them all again and fired the only event.
    logs = trigger_logs(airflow_live, dag_id, run_id, "smoke_test")
    assert logs.count("answered 4/4") >= 2 and logs.count("Trigger fired event") == 1, logs[-3000:]
    # The UI knows the launch task's extra link (empty on the local profile: no console page).
    links = airflow_live.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/launch/links")
    assert links.status_code == 200 and "Dataflow job" in links.json()["extra_links"], links.text


ROLLOUT = "gf-live-rollout"


def rollout_site_file(model_dir: Path) -> str:
    """A site that allows lasting deployments and serves ``model_dir``, whose weights the test then changes."""
    from tests.helpers import local_site_file, site_config

    return site_config(f"{ROLLOUT_SITE}.yaml", local_site_file(), bucket="gpuflow-live-rollout",
                       **{"model.name": str(model_dir), "limits.lasting_deployments": True,
                          "deployment.refresh_interval_s": 1})


def rollout_record(config_file: str) -> Path:
    """Where the site of ``config_file`` records the deployment."""
    from gpuflow.configuration.loading import load_config

    return Path(load_config(config_file).local.state_dir) / "deployments" / f"{ROLLOUT}.json"


def rolls_out_new_weights_through_a_killed_triggerer(airflow_live, config_file: str, conf: dict,
                                                     model_dir: Path) -> None:
    """The deployment that the run of ``conf`` made gets new weights, through a run of the same conf: its rollout's
    smoke test loses its triggerer (SIGKILL) while the trigger holds the answers. The release is not rolled back:
    the smoke test passes at its first try, and promote records the new version."""
    from gpuflow.configuration.loading import load_config
    from gpuflow.runs.naming import resource_names, run_prefix
    from tests.integration.test_deployment_local import new_weights

    record_file = rollout_record(config_file)
    first = json.loads(record_file.read_text())["model_version"]
    new_weights(model_dir, seed=1)
    second = start_run(airflow_live, ROLLOUT_DAG, conf)
    kill_the_triggerer_while_the_smoke_test_holds_its_answers(airflow_live, ROLLOUT_DAG, second, conf["smoke_test__num_prompts"])
    xcom = smoke_test_answers(airflow_live, ROLLOUT_DAG, second)
    plan = airflow_live.api("GET", f"/dags/{ROLLOUT_DAG}/dagRuns/{second}/taskInstances/preflight/xcomEntries/"
                                   "gpuflow_rollout", params={"deserialize": True}).json()["value"]
    plan = json.loads(plan) if isinstance(plan, str) else plan  # (3.1.8 gives it back as text)
    assert plan["path"] == "weights", plan  # the same conf and file: only the weights changed
    new_version = resource_names(load_config(config_file, conf), run_prefix(ROLLOUT_DAG, second)).model_version
    assert new_version != first and new_version in xcom["versions"], xcom
    record = json.loads(record_file.read_text())
    assert (record["model_version"], record["changed_by"]) == (new_version, second), record


def tears_the_deployment_down(airflow_live, config_file: str) -> None:
    teardown = f"{ROLLOUT_SITE}__llm_streaming_teardown"  # the teardown of the deployment's own site
    airflow_live.wait_for_dag(teardown)
    down = start_run(airflow_live, teardown, {"deployment__name": ROLLOUT})  # its form's
    assert airflow_live.wait_for_run(teardown, down, timeout_s=300)["state"] == "success"
    assert not rollout_record(config_file).exists()


def test_a_conf_that_breaks_the_params_schema_is_refused(airflow_live, local_config):
    airflow_live.wait_for_dag(DAG_ID)
    answer = airflow_live.api("POST", f"/dags/{DAG_ID}/dagRuns",
                              json={"logical_date": None, "conf": {"gpu__count": "many", "deployment__mode": "x"}})
    assert answer.status_code == 400, answer.text
    assert "gpu__count" in answer.text or "deployment__mode" in answer.text
    # A folded section's field is typed as well: below its minimum, refused.
    answer = airflow_live.api("POST", f"/dags/{DAG_ID}/dagRuns",
                              json={"logical_date": None, "conf": {"smoke_test__num_prompts": 0}})
    assert answer.status_code == 400, answer.text
    assert "smoke_test__num_prompts" in answer.text


def runs_of(airflow_live, dag_id: str) -> set[str]:
    """The DAG's manual runs (a scheduled DAG, unpaused, may start its own at any time)."""
    answer = airflow_live.api("GET", f"/dags/{dag_id}/dagRuns", params={"run_type": "manual"})
    return {run["dag_run_id"] for run in answer.json()["dag_runs"]}


def test_hostile_confs_through_the_rest_api_are_refused_before_anything_is_created(airflow_live, local_config,
                                                                                  rollout_model, tmp_path):
    """As a user whose role may trigger DAGs and no more (SimpleAuthManager's "user"), with nothing but the REST API:
    what the Params' schema can express is a 400; the rest fails each run's preflight (gpuflow.runs.run_policy), and
    its target is left as it was: no marker, no team file gone, no resource of the run, no other connection used.

    Airflow offers a DAG no way to refuse conf keys it does not declare at trigger time (create_dagrun merges the
    conf into the DAG's Params and validates those it declares), so those are refused by preflight."""
    import timeit

    from gpuflow.platform.emulators import LOCAL_CONN_ID, emulator_environment
    from gpuflow.runs.naming import resource_names, run_prefix
    from gpuflow.steps.resources import list_run_resources
    from tests.live_airflow import TRIGGER_USER

    marker, script, team = tmp_path / "owned", tmp_path / "payload.py", tmp_path / "team-folder"
    script.write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    team.mkdir()
    (team / "quarterly.csv").write_text("a,b\n")
    state = local_config.local.state_dir
    for dag_id in (DAG_ID, "dataproc_gpu_batch", BATCH_DAG):
        airflow_live.wait_for_dag(dag_id)
    # The schema: a configuration file, the site's own or another team's (the form's field offers the DAG's alone);
    # a cost knob beyond the site's limits (none set: no raise), a GPU type or a region outside them; a batch
    # folder with a '..' segment, or with a format character. A 400, and no run exists.
    runs_before = {dag_id: runs_of(airflow_live, dag_id) for dag_id in (DAG_ID, BATCH_DAG)}
    for dag_id, conf in ((DAG_ID, {"config_file": "configs/../../../etc/passwd.yaml"}),
                         (DAG_ID, {"config_file": rollout_site_file(rollout_model)}),  # another site's file
                         (DAG_ID, {"worker__max_num_workers": 1000, "gpu__count": 8}),
                         (DAG_ID, {"gpu__type": "nvidia-h100-80gb"}),
                         (DAG_ID, {"region": "europe-west4"}),  # the site lists no region beside its own
                         (DAG_ID, {"deployment__mode": "persistent"}),  # the local site allows no lasting one
                         (BATCH_DAG, {"batch__output": "/tmp/gpuflow/../../home/"}),
                         (BATCH_DAG, {"batch__output": f"{state}/answers\u202e/"})):
        answer = airflow_live.api("POST", f"/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf},
                                  user=TRIGGER_USER)
        assert answer.status_code == 400, answer.text
    assert {dag_id: runs_of(airflow_live, dag_id) for dag_id in runs_before} == runs_before
    # What no schema says: code (a key, a section), identity (a key holding '='), paths (outside the state folder, a
    # glob into gpuflow's own folder), format characters
    hostile = [
        ("dataproc_gpu_batch", {"dataproc__main_python_file": str(script)}),
        ("dataproc_gpu_batch", {"dataproc": {"main_python_file": timeit.__file__,
                                             "args": ["-n1", f"open({str(marker)!r}, 'w').write('ran')"]}}),
        (DAG_ID, {"gcp_conn_id": "another_teams_admin"}),
        (DAG_ID, {"gcp_conn_id=another_teams_conn #": None, "project=another-project #": None}),
        (BATCH_DAG, {"batch__output": f"{team}/"}),
        (BATCH_DAG, {"batch__input": f"{state}/gpuflo[w]/deployments/**"}),
        (DAG_ID, {"model__name": "gpuflow-demo\u200b"}),  # no schema pattern: preflight's
    ]
    runs = []
    for dag_id, conf in hostile:
        answer = airflow_live.api("POST", f"/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf},
                                  user=TRIGGER_USER)
        assert answer.status_code == 200, answer.text
        runs.append((dag_id, answer.json()["dag_run_id"]))
    refusals = ("only the configuration file sets it", "absolute path under local.state_dir", "does not declare",
                "format character", "wildcard", "not among the models")
    for dag_id, run_id in runs:
        run = airflow_live.wait_for_run(dag_id, run_id, timeout_s=300)
        states = {ti["task_id"]: ti["state"] for ti in airflow_live.api(
            "GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances").json()["task_instances"]}
        assert run["state"] == "failed" and states["preflight"] == "failed", (dag_id, states)
        assert {task for task, state in states.items() if state == "success"} <= {"cleanup"}, (dag_id, states)
        log = airflow_live.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/preflight/logs/1",
                               params={"full_content": True}).text
        assert any(words in log for words in refusals), log[-2000:]
        assert "another_teams_conn" not in log or "does not declare" in log  # named as refused, never used
        names = resource_names(local_config, run_prefix(dag_id, run_id))
        with emulator_environment(local_config):
            assert list_run_resources(local_config, names, LOCAL_CONN_ID) == {"topics": [], "subscriptions": [],
                                                                              "buckets": []}
    assert not marker.exists()
    assert sorted(path.name for path in team.iterdir()) == ["quarterly.csv"]


def test_an_xcom_edited_through_the_rest_api_then_a_cleared_task_acts_on_nothing(airflow_live, local_config,
                                                                                  tmp_path):
    """The role that may trigger may also edit XComs and clear tasks. After a benign Dataproc batch (local Spark),
    such a user rewrites preflight's result (the batch's main file and arguments: code) and clears the batch: the
    batch derives its configuration again from the file and the run's conf, finds the XCom differs, and refuses,
    having run nothing."""
    import timeit

    from tests.live_airflow import TRIGGER_USER

    dag_id, marker = "dataproc_gpu_batch", tmp_path / "owned"
    airflow_live.wait_for_dag(dag_id)
    answer = airflow_live.api("POST", f"/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": {}},
                              user=TRIGGER_USER)
    assert answer.status_code == 200, answer.text
    run_id = answer.json()["dag_run_id"]
    assert airflow_live.wait_for_run(dag_id, run_id, timeout_s=400)["state"] == "success"
    entry = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/preflight/xcomEntries/return_value"
    config = airflow_live.api("GET", entry, params={"deserialize": True}, user=TRIGGER_USER).json()["value"]
    config = json.loads(config) if isinstance(config, str) else config
    config["dataproc"] = {**config["dataproc"], "main_python_file": timeit.__file__,
                          "args": ["-n1", f"open({str(marker)!r}, 'w').write('ran')"]}
    edited = airflow_live.api("PATCH", entry, json={"value": config}, user=TRIGGER_USER)
    assert edited.status_code == 200, edited.text
    cleared = airflow_live.api("POST", f"/dags/{dag_id}/clearTaskInstances", user=TRIGGER_USER, json={
        "dry_run": False, "dag_run_id": run_id, "task_ids": ["batch"], "only_failed": False, "reset_dag_runs": True})
    assert cleared.status_code == 200, cleared.text
    run = airflow_live.wait_for_run(dag_id, run_id, timeout_s=400)
    assert run["state"] == "failed", run
    batch = [ti for ti in airflow_live.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances").json()[
        "task_instances"] if ti["task_id"] == "batch"][0]
    log = airflow_live.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/batch/logs/{batch['try_number']}",
                           params={"full_content": True}).text
    assert batch["state"] == "failed" and "is not what preflight derives" in log, log[-2000:]
    # 3.3 stores the edited value as the object it was sent as, and the message names what differs; 3.1.8 stores it
    # as text, which is no configuration at all
    assert "dataproc.args" in log and "dataproc.main_python_file" in log or "not a configuration at all" in log
    assert not marker.exists()


def test_the_api_refuses_requests_without_a_token(airflow_live):
    import requests

    answer = requests.get(f"{airflow_live.url}/api/v2/dags/{DAG_ID}", timeout=10)
    assert answer.status_code == 401


ARTIFACTS = ROOT / "tests" / "artifacts"
#: Where this test puts its pictures of the trigger form: tests/artifacts/ (ignored by git), so that a test run
#: leaves the tree as it found it; `make pictures` sets GPUFLOW_DOCS_PICTURES=docs to refresh those that
#: docs/trigger-form.md shows.
DOCS = Path(os.environ.get("GPUFLOW_DOCS_PICTURES") or ARTIFACTS)
if not DOCS.is_absolute():
    DOCS = ROOT / DOCS
DOCS.mkdir(parents=True, exist_ok=True)
CHROMIUM = "/usr/bin/chromium"


def frame_from_top(page, element, path: Path) -> None:
    """A picture of what a person sees: the element from its top, cut at the bottom of the window."""
    box = element.bounding_box()
    viewport = page.viewport_size
    height = min(box["height"], viewport["height"] - box["y"])
    page.screenshot(path=str(path), clip={"x": box["x"], "y": box["y"], "width": box["width"], "height": height})


@pytest.mark.slow
def test_the_trigger_form_in_a_browser_starts_a_deployment_that_rolls_out_new_weights(airflow_live, local_config,
                                                                                      rollout_model):
    """Headless Debian chromium, driven by Playwright (no browser download): log in, open the trigger form,
    check the labels and values a person reads, unfold a section, trigger a lasting deployment, and keep pictures
    of the form as it opens, of an unfolded section and of the finished run's grid. The run loses its triggerer
    twice on the way (``loses_its_triggerer_twice_and_answers_every_prompt_once``); the deployment then takes new
    weights through a run of the same conf whose triggerer is killed mid smoke test
    (``rolls_out_new_weights_through_a_killed_triggerer``), and the teardown removes it. (One deployment serves
    both: two runs of about 75 s each were one.)"""
    from gpuflow.runs.trigger_form import dag_form, dag_params
    from gpuflow.site_dags import site_dag

    assert Path(CHROMIUM).exists(), "Debian's chromium is missing: `make browser` (or .ci/run) installs it"
    ARTIFACTS.mkdir(exist_ok=True)
    started = time.time()
    airflow_live.wait_for_dag(ROLLOUT_DAG)
    # This test's emulators, state folder and model are in its site's file, which its DAGs read: the form shows
    # the file, and the model's field the model that file serves.
    model_dir = rollout_model
    config_file = rollout_site_file(model_dir)
    params = dag_params(dag_form(site_dag(config_file, "llm_streaming_inference")))  # each field's Param
    try:
        conf = deploys_through_the_form(airflow_live, params, config_file, model_dir, started)
        rolls_out_new_weights_through_a_killed_triggerer(airflow_live, config_file, conf, model_dir)
    finally:
        tears_the_deployment_down(airflow_live, config_file)


def deploys_through_the_form(airflow_live, params: dict, config_file: str, model_dir: Path,
                             started: float) -> dict:
    """The browser's part: the deployment's first run, triggered from the form. Its conf."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{airflow_live.url}/")
            page.get_by_label("Username").fill(USERNAME)
            page.get_by_label("Password").fill(airflow_live.password)
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_url(f"{airflow_live.url}/", timeout=60_000)

            page.goto(f"{airflow_live.url}/dags/{ROLLOUT_DAG}")
            page.get_by_role("button", name="Trigger").first.click()
            dialog = page.get_by_role("dialog")
            dialog.get_by_text("Run Parameters").wait_for()

            # How Airflow's UI marks a field's control: 3.3 names it (name=element_KEY); 3.1, Composer's floor, gives
            # it an id (element_KEY, or select:element_KEY, number-input:element_KEY around the input).
            def control(key: str):
                return dialog.locator(f'[name=element_{key}], input[id="element_{key}"], '
                                      f'[id="number-input:element_{key}"] input').first

            def choice(key: str):
                return dialog.locator(f'[id="element_{key}"], [id="select:element_{key}"]').first

            def field(key: str):
                anchors = (f'[name=element_{key}], [id="element_{key}"], [id="select:element_{key}"], '
                           f'[id="number-input:element_{key}"]')
                return dialog.locator(f"[data-scope=field][data-part=root][role=group]:has({anchors})").first

            # The per-run fields show a person's label, the config key in their help, and the value the run uses.
            shown = {"deployment__mode": "ephemeral", "model__name": str(model_dir), "model__max_new_tokens": "16",
                     "gpu__type": "nvidia-l4", "gpu__machine_type": "g2-standard-4"}
            for key, value in shown.items():
                assert field(key).locator("label").inner_text().strip().rstrip("*").strip() == params[key].schema["title"]
                assert field(key).locator("[data-part=helper-text]").inner_text().strip() == params[key].description
                if "enum" in params[key].schema:  # a choice (the site's limits make the GPU and machine types one)
                    assert value in choice(key).inner_text(), key
                else:
                    assert control(key).input_value() == value, key
            # The sections start folded: their fields are not shown until a person opens them.
            assert not control("smoke_test__num_prompts").is_visible()
            frame_from_top(page, dialog, DOCS / "trigger-form.png")
            # An enum offers exactly its choices, no "null".
            choice("deployment__mode").locator("[role=combobox]").click()
            offered = [option.inner_text().strip() for option in page.get_by_role("option").all()]
            assert sorted(offered) == ["ephemeral", "persistent"], offered
            page.get_by_role("option", name="persistent", exact=True).click()  # a lasting deployment
            control("deployment__name").fill(ROLLOUT)

            control("model__max_new_tokens").fill("8")
            # One section is open at a time: unfolding one folds "Run Parameters" (its values stay).
            section = dialog.get_by_role("button", name="Smoke test", exact=True)
            section.click()
            prompts = control("smoke_test__num_prompts")
            prompts.wait_for()
            # Each key is a typed field of its own, with its label and the file's value.
            assert prompts.input_value() == "8"
            for key in ("smoke_test__num_prompts", "smoke_test__timeout_s", "smoke_test__gpu_usage"):
                label = field(key).locator("label").inner_text().strip().rstrip("*").strip()
                assert label == params[key].schema["title"], key
            assert "fail" in choice("smoke_test__gpu_usage").inner_text()  # an enum: a choice
            section.scroll_into_view_if_needed()
            page.evaluate("element => element.scrollIntoView({block: 'start'})", section.element_handle())
            frame_from_top(page, section.locator("xpath=ancestor::*[@data-part='item'][1]"),
                           DOCS / "trigger-form-section.png")
            prompts.fill("4")
            # The site's file waits 240 s for answers: the field's bound, since its limits allow no raise.
            assert params["smoke_test__timeout_s"].schema["maximum"] == 240
            # The configuration file's field shows the site's file, its only choice: the run cannot name another.
            dialog.get_by_role("button", name="Configuration file", exact=True).click()
            shown_file = choice("config_file")
            shown_file.wait_for()
            assert config_file in shown_file.inner_text()
            runs_before = runs_of(airflow_live, ROLLOUT_DAG)
            dialog.get_by_role("button", name="Trigger").click()

            run_id = airflow_live.wait_for_new_run(ROLLOUT_DAG, runs_before)
            loses_its_triggerer_twice_and_answers_every_prompt_once(airflow_live, ROLLOUT_DAG, run_id)
            run = airflow_live.wait_for_run(ROLLOUT_DAG, run_id, timeout_s=900)
            assert run["state"] == "success", airflow_live.log_tail("scheduler")
            # The form's values reached the run, and the run used them.
            assert run["conf"].get("config_file", config_file) == config_file
            assert (run["conf"]["model__max_new_tokens"], run["conf"]["smoke_test__num_prompts"]) == (8, 4)
            assert (run["conf"]["deployment__mode"], run["conf"]["deployment__name"]) == ("persistent", ROLLOUT)
            assert run["conf"]["model__name"] == str(model_dir)
            smoke = airflow_live.api("GET", f"/dags/{ROLLOUT_DAG}/dagRuns/{run_id}/taskInstances/smoke_test/xcomEntries/"
                                            "return_value", params={"deserialize": True}).json()["value"]
            assert smoke["sent"] == 4
            page.goto(f"{airflow_live.url}/dags/{ROLLOUT_DAG}/runs/{run_id}")
            page.get_by_text("smoke_test").first.wait_for()
            page.wait_for_timeout(2000)
            page.screenshot(path=str(ARTIFACTS / "finished-run-grid.png"), full_page=True)
        except Exception:
            (ARTIFACTS / "trigger-form-failure.html").write_text(page.content())  # what the browser had, for a reader
            raise
        finally:
            browser.close()
    for picture in (DOCS / "trigger-form.png", DOCS / "trigger-form-section.png", ARTIFACTS / "finished-run-grid.png"):
        assert picture.stat().st_size > 10_000 and picture.stat().st_mtime > started, picture
    return run["conf"]


BATCH_DAG = f"{LOCAL_SITE}__llm_batch_inference"


@pytest.mark.slow
def test_backfills_of_overlapping_batch_runs_succeed_at_first_try_while_deferred_tasks_free_their_slots(
        airflow_live, local_config):
    """A backfill (as `airflow backfill create` makes it) of two dates at once, under the real scheduler
    (LocalExecutor, parallelism 2), dag-processor and triggerer. Every run succeeds at its first try: the deferred run_batch never
    races its own job (a job that kept the task's stdin held the task open until the job ended, the moment its
    trigger fired: apache/airflow#67287), nor the scheduler's read of its deferral's exit (gpuflow.triggers.settle).
    The executor hears of each deferral at once, so its slot is free while the job runs, and it never reports a
    task finished that the scheduler has queued again."""
    import json
    import tempfile

    # Under local.state_dir: the only local folders a run's conf may point batch.* at (gpuflow.runs.run_policy).
    tmp_path = Path(tempfile.mkdtemp(prefix="backfill-", dir=local_config.local.state_dir))
    conf = {"model__max_new_tokens": 4,
            "batch__input": f"{tmp_path}/prompts/{{ds}}/*.jsonl", "batch__output": f"{tmp_path}/answers/{{ds}}/",
            "batch__dead_letter_output": f"{tmp_path}/dead_letters/{{ds}}/", "batch__input_wait_s": 0}
    # Two runs at once, as parallelism allows. (A second backfill proved nothing more, for 2 minutes of CI: the
    # race itself is provoked by test_tasks_whose_jobs_end_just_after_they_defer_each_succeed_at_their_first_try.)
    days = ["2026-03-01", "2026-03-02"]
    for day in days:
        (tmp_path / "prompts" / day).mkdir(parents=True)
        (tmp_path / "prompts" / day / "part-0.jsonl").write_text(
            "".join(json.dumps({"id": f"{day}-{i}", "prompt": f"question {i} of {day}"}) + "\n" for i in range(2)))
    airflow_live.wait_for_dag(BATCH_DAG)
    run_backfill(airflow_live, conf, days, tmp_path)

    scheduler = (airflow_live.home / "scheduler.log").read_text(errors="replace").splitlines()
    assert not [line for line in scheduler if "but the task instance's state attribute is" in line]
    # Each run_batch either saw its job end within its short wait in the worker (gpuflow.triggers.settle: nothing
    # deferred), or deferred while its job still ran, and its deferral ended its workload (the supervisor's
    # "Workload finished ... final_state=deferred": its executor slot freed). The deferral's time is its trigger's
    # (the "deferred at" it logs); the job's end is when the shell that runs it wrote its exit status. (The
    # supervisor logs the workload's end seconds after the deferral under load: in CI once 4.6 s after a job that
    # ended after the worker's last look, so that log's time is no measure of when the task deferred.) A job may
    # end between the worker's last look and the deferral: one poll of LocalProcessTrigger (0.5 s) is allowed.
    from gpuflow.runs.naming import run_prefix

    def deferred_at(run_id: str) -> datetime:
        folder = airflow_live.home / "logs" / f"dag_id={BATCH_DAG}" / f"run_id={run_id}" / "task_id=run_batch"
        logs = "".join(path.read_text(errors="replace") for path in sorted(folder.glob("*.log.trigger.*")))
        starts = [line for line in holds(logs) if line[0] == "start"]
        assert starts, f"no trigger of {run_id}'s run_batch logged its deferral: {logs[-2000:]}"
        return datetime.fromtimestamp(min(line[2] for line in starts), tz=UTC)

    freed_at = slots_freed_by_deferral(scheduler, "run_batch")
    runs = airflow_live.api("GET", f"/dags/{BATCH_DAG}/dagRuns", params={"run_type": "backfill"}).json()["dag_runs"]
    assert len(runs) == len(days) and set(freed_at) <= {run["dag_run_id"] for run in runs}, (runs, freed_at)
    for run_id in (run["dag_run_id"] for run in runs):
        exit_file = Path(local_config.local.state_dir) / f"{run_prefix(BATCH_DAG, run_id)}-pipeline.log.exit"
        job_ended = datetime.fromtimestamp(exit_file.stat().st_mtime, tz=UTC)
        if run_id in freed_at:
            deferred = deferred_at(run_id)
            assert deferred < job_ended + timedelta(seconds=0.5), (run_id, deferred, freed_at[run_id], job_ended)
        else:
            log = airflow_live.api("GET", f"/dags/{BATCH_DAG}/dagRuns/{run_id}/taskInstances/run_batch/logs/1",
                                   params={"full_content": True}).text
            assert "going on in this worker, without deferring" in log, log[-3000:]


QUICK_DAG = "quick_deferrals"


def test_tasks_whose_jobs_end_just_after_they_defer_each_succeed_at_their_first_try(airflow_live):
    """Airflow's defer-exit race (gpuflow.triggers.settle), provoked: each task of tests/dags/quick_deferrals.py
    waits HOLD_S in its worker, defers, and its job ends half a second later, under the real scheduler
    (LocalExecutor, parallelism 2) and triggerer. The scheduler reads every deferral's exit while the task is still
    deferred: no "state attribute is" line, every task at its first try. (Without the hold, 15 of 18 such tasks went
    to a second try on Airflow 3.3.2 and 9 of 18 on 3.1.8, under load: benchmarks/defer_race.py.)"""
    from tests.dags.quick_deferrals import TASKS

    airflow_live.wait_for_dag(QUICK_DAG)
    answer = airflow_live.api("POST", f"/dags/{QUICK_DAG}/dagRuns", json={"logical_date": None, "conf": {"job_s": 0.5}})
    assert answer.status_code == 200, answer.text
    run_id = answer.json()["dag_run_id"]
    run = airflow_live.wait_for_run(QUICK_DAG, run_id, timeout_s=600)
    tis = airflow_live.api("GET", f"/dags/{QUICK_DAG}/dagRuns/{run_id}/taskInstances").json()["task_instances"]
    states = {ti["task_id"]: (ti["state"], ti["try_number"]) for ti in tis}
    assert run["state"] == "success" and set(states.values()) == {("success", 1)}, states
    assert len(states) == TASKS
    scheduler = (airflow_live.home / "scheduler.log").read_text(errors="replace").splitlines()
    assert not [line for line in scheduler if "but the task instance's state attribute is" in line and QUICK_DAG in line]
    for task_id in states:  # each did defer, and the scheduler read that exit while the task was still deferred
        logs = airflow_live.api("GET", f"/dags/{QUICK_DAG}/dagRuns/{run_id}/taskInstances/{task_id}/logs/1",
                                params={"full_content": True}).text
        assert "Pausing task as DEFERRED" in logs, logs[-2000:]
        read = [line for line in scheduler if "TaskInstance Finished:" in line and f"dag_id={QUICK_DAG}," in line
                and f"task_id={task_id}," in line and f"run_id={run_id}," in line]
        assert read and "state=deferred," in read[0], read


def _logged_at(line: str) -> datetime:
    return datetime.fromisoformat(line[:26].replace("T", " ")).replace(tzinfo=UTC)


def slots_freed_by_deferral(scheduler: list[str], task_id: str) -> dict[str, datetime]:
    """When each deferral of ``task_id`` ended its workload, by run id, from the scheduler's log: Airflow 3.3 pauses
    the task ("Pausing task as DEFERRED ... ti_id= run_id=") and says "Workload finished ... final_state=deferred"
    for that ti; Airflow 3.1 (Composer's floor) says "TaskInstance Finished: ... task_id=..., run_id=..., ...
    state=deferred"."""
    paused = {line.split("ti_id=")[1].split()[0]: line.split("run_id=")[1].split()[0] for line in scheduler
              if "Pausing task as DEFERRED" in line and f"task_id={task_id}" in line}
    if paused:
        return {run_id: next(_logged_at(line) for line in scheduler if "Workload finished" in line
                             and f"workload_id={ti_id}" in line and "final_state=deferred" in line)
                for ti_id, run_id in paused.items()}
    return {line.split("run_id=")[1].split(",")[0]: _logged_at(line) for line in scheduler
            if "TaskInstance Finished:" in line and f"task_id={task_id}," in line and "state=deferred," in line}


def run_backfill(airflow_live, conf: dict, days: list[str], folder: Path) -> None:
    """One backfill of ``days``, as `airflow backfill create` makes it, through the API server: every run succeeds,
    every task at its first try, and every date is published."""
    body = {"dag_id": BATCH_DAG, "from_date": f"{days[0]}T00:00:00Z", "to_date": f"{days[-1]}T00:00:00Z",
            "dag_run_conf": conf, "max_active_runs": 10}  # the CLI's default
    created = airflow_live.api("POST", "/backfills", json=body)
    assert created.status_code == 200, created.text
    for run in airflow_live.wait_for_backfill_runs(BATCH_DAG, days, timeout_s=900):
        tis = airflow_live.api("GET", f"/dags/{BATCH_DAG}/dagRuns/{run['dag_run_id']}/taskInstances").json()
        states = {ti["task_id"]: (ti["state"], ti["try_number"]) for ti in tis["task_instances"]}
        assert run["state"] == "success", (states, airflow_live.log_tail("scheduler"))
        assert {try_number for state, try_number in states.values() if state == "success"} == {1}, states
    for day in days:
        assert (folder / "answers" / day / "_SUCCESS").exists()


def test_the_live_airflow_runs_on_its_own_postgresql_database(airflow_live, postgres_server):
    """As on Composer (a Cloud SQL instance, PostgreSQL): the api-server, the scheduler and the triggerer each hold
    connections to this home's own database on the session's server, as pg_stat_activity shows them, matched to the
    processes by their sockets' ports. A home that fell back to SQLite has none."""
    import psutil

    database = airflow_live.database_url.rsplit("/", 1)[1]
    airflow_live.api("GET", "/dags").raise_for_status()  # (the api-server opens its pool at its first request)
    found: dict[str, set[int]] = {}
    deadline = time.monotonic() + 60
    while True:
        sessions = {port for (port,) in postgres_server.query(
            "postgres", "SELECT client_port FROM pg_stat_activity WHERE datname = %s AND client_addr = '127.0.0.1'",
            database)}
        for name in ("api-server", "scheduler", "triggerer"):
            main = psutil.Process(airflow_live.processes[name].pid)
            ports = {connection.laddr.port for process in (main, *main.children(recursive=True))
                     for connection in process.net_connections(kind="tcp")
                     if connection.raddr and connection.raddr.port == postgres_server.port}
            found[name] = ports & sessions
        if all(found.values()):
            break
        assert time.monotonic() < deadline, f"no session in {database} for {[n for n, p in found.items() if not p]}"
        time.sleep(0.5)
    assert not list(airflow_live.home.glob("*.db")), "an SQLite database in the Airflow home"
