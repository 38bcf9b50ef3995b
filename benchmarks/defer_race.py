"""Airflow's defer-exit race (``gpuflow.triggers.settle``), counted without and with gpuflow's hold, on a live
Airflow under load. Run by hand, one Airflow line per venv:

    .venv/bin/python benchmarks/defer_race.py                       # our pins (Airflow 3.3.2)
    .venv-composer-3.1.8/bin/python benchmarks/defer_race.py        # Composer's floor (make test-composer LINE=3.1.8 first)

For each hold (0, as gpuflow did before; then ``HOLD_S``), it starts the real api-server, scheduler (LocalExecutor,
parallelism 2), dag-processor and triggerer on tests/dags/, keeps every core busy with a spinning process, and runs
``--runs`` runs of quick_deferrals at once: each task's job ends ``--job-s`` after the task defers. It prints, side by
side: deferrals, tasks that went to a second try, the scheduler's "state attribute is" lines, and how long after each
deferral the scheduler read the deferring worker's exit (its first "TaskInstance Finished:" line for the task: "state=deferred" when in time, else the state the task
had already moved on to).
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.dags.quick_deferrals import TASKS  # noqa: E402
from tests.live_airflow import LiveAirflow  # noqa: E402 - the same harness as the live tests

DAG_ID = "quick_deferrals"
MISMATCH = "but the task instance's state attribute is"


def spin() -> None:
    while True:
        pass


def logged_at(line: str) -> datetime:
    return datetime.fromisoformat(line[:26].replace("T", " ")).replace(tzinfo=UTC)


def exit_read_after_deferral_s(scheduler: list[str], ti_states: dict[tuple[str, str], datetime]) -> list[float]:
    """Seconds from each first-try deferral to the scheduler's first line that it read the task's worker exit."""
    read: list[float] = []
    for (run_id, task_id), deferred_at in ti_states.items():
        for line in scheduler:
            if "TaskInstance Finished:" in line and f"task_id={task_id}," in line and f"run_id={run_id}," in line:
                read.append((logged_at(line) - deferred_at).total_seconds())
                break
    return read


def deferred_at(live: LiveAirflow, run_id: str) -> dict[tuple[str, str], datetime]:
    """When each task of the run deferred: its task log's "Pausing task as DEFERRED" (a JSON line), first try."""
    import json

    found = {}
    for path in (live.home / "logs" / f"dag_id={DAG_ID}" / f"run_id={run_id}").glob("task_id=*/attempt=1.log"):
        for line in path.read_text(errors="replace").splitlines():
            if "Pausing task as DEFERRED" in line:
                record = json.loads(line)
                found[(run_id, record["task_id"])] = datetime.fromisoformat(record["timestamp"].replace("Z", "+00:00"))
                break
    return found


def measure(hold_s: float, runs: int, job_s: float) -> dict:
    from importlib.metadata import version

    from tests.live_airflow import free_port
    from tests.postgres import PostgresServer

    server = PostgresServer.start(free_port())  # Airflow's database as Composer's: PostgreSQL (tests/postgres.py)
    live = LiveAirflow(Path(tempfile.mkdtemp(prefix="defer-race-")), server.database_url("defer_race"),
                       dags_folder=ROOT / "tests" / "dags", extra_env={"GPUFLOW_TRIGGER_SETTLE_S": str(hold_s)})
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(multiprocessing.cpu_count())]
    try:
        live.start()
        live.wait_for_dag(DAG_ID)
        for spinner in spinners:
            spinner.start()
        run_ids = []
        for _ in range(runs):
            answer = live.api("POST", f"/dags/{DAG_ID}/dagRuns", json={"logical_date": None, "conf": {"job_s": job_s}})
            answer.raise_for_status()
            run_ids.append(answer.json()["dag_run_id"])
        tis = []
        for run_id in run_ids:
            live.wait_for_run(DAG_ID, run_id, timeout_s=1800)
            tis += live.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances").json()["task_instances"]
    finally:
        for spinner in spinners:
            spinner.kill()
        live.stop()
        server.stop()
    scheduler = (live.home / "scheduler.log").read_text(errors="replace").splitlines()
    starts = {}
    for run_id in run_ids:
        starts.update(deferred_at(live, run_id))
    read = exit_read_after_deferral_s(scheduler, starts)
    return {"airflow": version("apache-airflow"), "hold_s": hold_s, "tasks": len(tis), "deferrals": len(starts),
            "retried": sum(ti["try_number"] > 1 for ti in tis), "failed": sum(ti["state"] != "success" for ti in tis),
            "mismatch_lines": sum(MISMATCH in line for line in scheduler),
            "exit_read_s": read, "home": str(live.home)}


def main() -> None:
    from gpuflow.triggers.settle import HOLD_S

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=4, help="runs of quick_deferrals at once (4 tasks each)")
    parser.add_argument("--job-s", type=float, default=0.5, help="seconds a job outlasts its task's deferral")
    parser.add_argument("--holds", type=float, nargs="+", default=[0.0, HOLD_S], help="holds to compare")
    args = parser.parse_args()
    started = time.monotonic()
    rows = [measure(hold, args.runs, args.job_s) for hold in args.holds]
    print(f"\nquick deferrals under load: {args.runs} runs x {TASKS} tasks, jobs ending {args.job_s}s after the deferral")
    print(f"{'airflow':>8} {'hold_s':>7} {'tasks':>6} {'deferred':>9} {'retried':>8} {'failed':>7} {'mismatch':>9}"
          f" {'exit read after deferral (s): median / max':>44}")
    for row in rows:
        read = row["exit_read_s"]
        spread = f"{statistics.median(read):.1f} / {max(read):.1f} (n={len(read)})" if read else "not read"
        print(f"{row['airflow']:>8} {row['hold_s']:>7.1f} {row['tasks']:>6} {row['deferrals']:>9} {row['retried']:>8}"
              f" {row['failed']:>7} {row['mismatch_lines']:>9} {spread:>44}")
    print(f"({time.monotonic() - started:.0f}s; Airflow homes: {', '.join(row['home'] for row in rows)})")


if __name__ == "__main__":
    main()
