"""Parse time of each DAG file next to a one-task DAG, measured in the same run.

    .venv/bin/python benchmarks/dag_parse.py [--repeats 7]

Each parse runs in a fresh interpreter that has already imported Airflow's SDK, as Airflow's DAG
processor has; the time is that of executing the DAG file (its own imports included). Bytecode is
written and used, as on a DAG processor (PYTHONDONTWRITEBYTECODE is dropped; one warm-up parse each).
The files are parsed in turn within each round, so that a slow spell of the machine hits all of them;
each figure is the median over the rounds.
Bound: at most 2.5 times the one-task DAG with the same kind of schedule (a DAG file's own parse is a few tens of
ms, far below the dag-processor's start; what matters at parse time is that no heavy module loads, which
tests/unit/test_dag_parse.py checks). Run by hand, not in `make test`.
"""

from __future__ import annotations

import argparse
import os
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


#: The bound on each DAG file against its one-task DAG.
TARGET = 2.5


def parse_seconds(path: Path) -> float:
    code = TIMER.format(path=str(path), plugins=str(ROOT / "plugins"))
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    return float(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="gpuflow-bench-parse-"))
    files: dict[str, Path] = {}
    for name, schedule in BASELINES.items():
        files[f"one-task DAG, {name}"] = workdir / f"one_task_{name.strip('@')}.py"
        files[f"one-task DAG, {name}"].write_text(ONE_TASK_DAG.replace("SCHEDULE", schedule))
    files.update({dag_file.name: dag_file for dag_file in sorted((ROOT / "dags").glob("*.py"))})
    for path in files.values():
        parse_seconds(path)  # warm-up: compiles and caches the bytecode
    timings: dict[str, list[float]] = {name: [] for name in files}
    for _ in range(args.repeats):
        for name, path in files.items():
            timings[name].append(parse_seconds(path))
    median = {name: statistics.median(values) for name, values in timings.items()}
    for name in BASELINES:
        print(f"one-task DAG, {name}: {median[f'one-task DAG, {name}'] * 1000:.1f} ms (median of {args.repeats})")
    for name, path in files.items():
        if name.startswith("one-task"):
            continue
        kind = "unscheduled" if "schedule=None" in path.read_text() else "@daily"  # the batch DAG's: its file's
        ratio = median[name] / median[f"one-task DAG, {kind}"]
        print(f"{name:<32} {median[name] * 1000:7.1f} ms   ratio {ratio:.2f} against the {kind} one-task DAG "
              f"(bound <= {TARGET}: {'met' if ratio <= TARGET else 'MISSED'})")


if __name__ == "__main__":
    main()
