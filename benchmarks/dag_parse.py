"""Parse time of each DAG file next to a one-task DAG, measured in the same run.

    .venv/bin/python benchmarks/dag_parse.py [--repeats 7]

Each parse runs in a fresh interpreter that has already imported Airflow's SDK, as Airflow's DAG
processor has; the time is that of executing the DAG file (its own imports included).
Target: at most 1.5 times the one-task DAG. Run by hand, not in `make test`.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ONE_TASK_DAG = '''
import pendulum
from airflow.sdk import DAG
from airflow.providers.standard.operators.empty import EmptyOperator

with DAG(dag_id="one_task", schedule=SCHEDULE, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False):
    EmptyOperator(task_id="only")
'''
#: A cron schedule costs Airflow ~30 ms by itself (its cron timetable), so scheduled DAGs get a scheduled baseline.
BASELINES = {"unscheduled": "None", "@daily": '"@daily"'}

TIMER = """
import runpy, sys, time
import airflow.sdk, pendulum  # what the DAG processor has loaded before it parses a file
sys.path.insert(0, {plugins!r})
started = time.perf_counter()
runpy.run_path({path!r})
print(time.perf_counter() - started)
"""


def parse_seconds(path: Path, repeats: int) -> float:
    timings = []
    for _ in range(repeats):
        code = TIMER.format(path=str(path), plugins=str(ROOT / "plugins"))
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        timings.append(float(result.stdout.strip().splitlines()[-1]))
    return statistics.median(timings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="gpuflow-bench-parse-"))
    baselines = {}
    for name, schedule in BASELINES.items():
        baseline_file = workdir / f"one_task_{name.strip('@')}.py"
        baseline_file.write_text(ONE_TASK_DAG.replace("SCHEDULE", schedule))
        baselines[name] = parse_seconds(baseline_file, args.repeats)
        print(f"one-task DAG, {name}: {baselines[name] * 1000:.1f} ms (median of {args.repeats})")
    for dag_file in sorted((ROOT / "dags").glob("*.py")):
        kind = "@daily" if 'schedule="@daily"' in dag_file.read_text() else "unscheduled"
        seconds = parse_seconds(dag_file, args.repeats)
        print(f"{dag_file.name:<32} {seconds * 1000:7.1f} ms   ratio {seconds / baselines[kind]:.2f} "
              f"against the {kind} one-task DAG (target <= 1.5)")


if __name__ == "__main__":
    main()
