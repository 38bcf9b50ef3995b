"""gpuflow_janitor on the local profile: a run killed mid-launch leaves its pipeline process, topics,
subscriptions and bucket; its DAG run is deleted. The janitor (dag.test(), asking Airflow for run states) lists
exactly those in a dry run, then deletes exactly those, and leaves a live deployment alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from airflow.utils.state import DagRunState

from gpuflow.naming import deployment_prefix

LIVE = "gf-janitor-live"
BUCKET = "gpuflow-janitor-test"


def local_conf(local_config, **extra) -> dict:
    local = local_config.local
    return {"local__state_dir": local.state_dir, "local__pubsub_emulator_host": local.pubsub_emulator_host,
            "local__storage_emulator_host": local.storage_emulator_host, "model__max_new_tokens": 4, **extra}


def kill_a_run_mid_launch(local_config, state_dir: Path) -> str:
    """Run llm_streaming_inference in a process of its own, and SIGKILL it once its pipeline process has started
    (the launch task waits for it to run): what a worker that died mid-launch leaves. Returns the run's prefix."""
    before = set(state_dir.glob("*-pipeline.pid"))
    script = textwrap.dedent(f"""
        import json, sys
        from airflow.dag_processing.dagbag import DagBag
        dag = DagBag({str(Path(__file__).resolve().parents[2] / "dags")!r}).dags["llm_streaming_inference"]
        dag.test(run_conf=json.loads(sys.argv[1]))
    """)
    import json

    log = open(state_dir / "killed-run.log", "wb")  # noqa: SIM115 - the run's output, for a failure's reader
    worker = subprocess.Popen([sys.executable, "-c", script, json.dumps(local_conf(local_config))],
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 240
    while not (started := set(state_dir.glob("*-pipeline.pid")) - before):
        assert worker.poll() is None and time.monotonic() < deadline, "the run ended before its launch"
        time.sleep(0.2)
    os.killpg(worker.pid, signal.SIGKILL)
    worker.wait()
    (pid_file,) = started
    return pid_file.name.removesuffix("-pipeline.pid")


def delete_dag_run(run_id: str) -> None:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import delete

    with create_session() as session:
        session.execute(delete(DagRun).where(DagRun.run_id == run_id))


def test_the_janitor_removes_exactly_what_a_killed_run_left_and_nothing_of_a_live_deployment(
        airflow_db, local_config, emulators):
    from airflow.dag_processing.dagbag import DagBag

    from gpuflow.emulators import LOCAL_CONN_ID, emulator_environment, process_alive
    from gpuflow.naming import resource_names, run_prefix
    from gpuflow.platform.records import Records
    from gpuflow.steps.resources import list_named, list_run_resources
    from tests.helpers import ROOT

    bag = DagBag(str(ROOT / "dags"))
    serve, janitor, teardown = (bag.dags[d] for d in ("llm_streaming_inference", "gpuflow_janitor",
                                                      "llm_streaming_teardown"))
    state_dir = Path(local_config.local.state_dir)
    live_conf = local_conf(local_config, bucket=BUCKET, deployment__mode="persistent", deployment__name=LIVE)
    deployed = serve.test(run_conf=live_conf)
    assert deployed.state == DagRunState.SUCCESS
    record = Records(local_config, LOCAL_CONN_ID).read(LIVE)

    killed = resource_names(local_config, kill_a_run_mid_launch(local_config, state_dir))
    pid = int((state_dir / f"{killed.prefix}-pipeline.pid").read_text())
    with emulator_environment(local_config):
        lease = Records(local_config, LOCAL_CONN_ID).read_lease(killed.prefix)
        left = list_run_resources(local_config, killed, LOCAL_CONN_ID)
        live_before = list_named(local_config, LOCAL_CONN_ID, deployment_prefix(LIVE))
    assert len(left["topics"]) == 3 and len(left["subscriptions"]) == 3 and left["buckets"] == [killed.bucket]
    assert process_alive(pid)
    assert lease["dag_id"] == "llm_streaming_inference"
    assert run_prefix(lease["dag_id"], lease["run_id"]) == killed.prefix
    delete_dag_run(lease["run_id"])

    janitor_conf = {**local_conf(local_config), "bucket": BUCKET}
    dry = janitor.test(run_conf={**janitor_conf, "janitor__dry_run": True})
    assert dry.state == DagRunState.SUCCESS
    listed = dry.get_task_instance("janitor").xcom_pull(task_ids="janitor")
    assert listed["dry_run"] is True
    assert [job["id"] for job in listed["jobs"]] == [str(pid)]
    assert sorted(listed["topics"]) == sorted(left["topics"])
    assert sorted(listed["subscriptions"]) == sorted(left["subscriptions"])
    assert listed["buckets"] == [killed.bucket] and listed["prefixes"] == []
    assert process_alive(pid)  # a dry run deletes nothing

    swept = janitor.test(run_conf={**janitor_conf, "janitor__dry_run": False})
    assert swept.state == DagRunState.SUCCESS
    assert not process_alive(pid)
    with emulator_environment(local_config):
        assert list_run_resources(local_config, killed, LOCAL_CONN_ID) == {"topics": [], "subscriptions": [],
                                                                          "buckets": []}
        assert list_named(local_config, LOCAL_CONN_ID, deployment_prefix(LIVE)) == live_before
        assert Records(local_config, LOCAL_CONN_ID).read(LIVE) == record
    assert process_alive(int(record.job["id"]))

    down = teardown.test(run_conf={**local_conf(local_config), "bucket": BUCKET, "deployment__name": LIVE})
    assert down.state == DagRunState.SUCCESS
    assert not process_alive(int(record.job["id"]))
