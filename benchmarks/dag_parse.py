"""Parse time of each DAG file next to a one-task DAG, measured two ways in the same run: the repository's own DAG
files, and the DAG files of three sites (``gpuflow site-dags``: one file that makes a site's five DAGs) in one DAG
folder, as three teams share one Composer.

    .venv/bin/python benchmarks/dag_parse.py [--repeats 15]

- **dag-processor**: as Airflow 3's dag-processor parses. Its main process has Airflow loaded; before it forks a
  file's parse it imports the ``airflow.*`` modules the file names (``[dag_processor] parsing_pre_import_modules``,
  on by default: ``_pre_import_airflow_modules`` in ``airflow/dag_processing/processor.py``, with Airflow's own
  ``iter_airflow_imports``). The time is the forked child's execution of the file. A provider operator the DAG file
  names is therefore imported once, before the fork, and costs each parse little; a module the file reaches only
  through gpuflow's own packages is imported in every child.
- **fresh interpreter**: a new Python process that imports everything the file needs, from nothing. This is what a
  one-off ``python dags/x.py`` costs, not what Airflow pays per parse.

Bytecode is written and used, as on a dag-processor (PYTHONDONTWRITEBYTECODE is dropped; one warm-up parse each).
The files are measured in turn within each round, so that a slow spell of the machine hits all of them; each figure
is the median over the rounds. Bound, on the dag-processor figure: at most 2.5 times the one-task DAG with the same
kind of schedule; the script exits 1 when a file misses it. What must never load at parse time (torch, Beam,
transformers) tests/unit/test_dag_parse.py checks. Run by hand, not in `make test` (a timed bound does not belong in
the tests: their two workers load the machine as they please); the figures are in docs/benchmarks.md.
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

#: The provider's stock pieces gpuflow weighed against its own, each alone in a one-task DAG (unscheduled): what
#: naming it in a DAG file costs each parse.
STOCK_DAG = '''
import pendulum
from airflow.sdk import DAG
IMPORT

with DAG(dag_id="stock", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False):
    TASK
'''
STOCK = {
    "stock GCSObjectExistenceSensor": (
        "from airflow.providers.google.cloud.sensors.gcs import GCSObjectExistenceSensor",
        'GCSObjectExistenceSensor(task_id="only", bucket="b", object="in/*.jsonl", use_glob=True, deferrable=True)'),
    "stock Dataproc create+delete batch": (
        "from airflow.providers.google.cloud.operators.dataproc import (\n"
        "    DataprocCreateBatchOperator, DataprocDeleteBatchOperator)",
        'DataprocCreateBatchOperator(task_id="only", batch={}, batch_id="b", region="r", deferrable=True) >> '
        'DataprocDeleteBatchOperator(task_id="delete", batch_id="b", region="r")'),
    "stock DataflowJobLink (links)": (
        "from airflow.providers.google.cloud.links.dataflow import DataflowJobLink\n"
        "from airflow.providers.standard.operators.empty import EmptyOperator\n"
        "class Linked(EmptyOperator):\n    operator_extra_links = (DataflowJobLink(),)",
        'Linked(task_id="only")'),
}

#: One process per file: Airflow loaded, the file's airflow.* imports done (as the dag-processor does before its
#: fork), then ``repeats`` forked parses, each timed in its child and reported through a pipe.
DAG_PROCESSOR = """
import importlib, os, runpy, sys, time
import airflow.sdk, pendulum
from airflow.utils.file import iter_airflow_imports
sys.path.insert(0, {plugins!r})
for module in iter_airflow_imports({path!r}):
    importlib.import_module(module)
for _ in range({forks}):
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        started = time.perf_counter()
        runpy.run_path({path!r})
        os.write(write, str(time.perf_counter() - started).encode())
        os._exit(0)
    os.close(write)
    print(os.read(read, 64).decode())
    os.waitpid(child, 0)
"""

FRESH = """
import time
started = time.perf_counter()
import runpy, sys
sys.path.insert(0, {plugins!r})
runpy.run_path({path!r})
print(time.perf_counter() - started)
"""

#: The bound on each DAG file against its one-task DAG (the dag-processor figure).
TARGET = 2.5
#: The repository's DAG files whose DAG is scheduled (their schedule is in gpuflow.site_dags, not in the file).
SCHEDULED = {"llm_batch_inference.py", "gpu_quota_report.py", "gpuflow_janitor.py"}
#: The sites of the benchmark's shared DAG folder.
SITES = ("team-a", "team-b", "team-c")


def site_files(workdir: Path) -> dict[str, Path]:
    """Three sites' DAG files, each making its DAGs from a copy of configs/local.yaml of its own."""
    sys.path.insert(0, str(ROOT / "plugins"))
    from gpuflow.sites import write_site_dag_file

    files = {}
    for site in SITES:
        config = workdir / "site" / f"{site}.yaml"
        config.parent.mkdir(exist_ok=True)
        config.write_text((ROOT / "configs" / "local.yaml").read_text())
        files[f"site {site} (5 DAGs)"] = write_site_dag_file(config, workdir / "dags")
    return files


def _run(code: str) -> list[float]:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    return [float(line) for line in result.stdout.split()]


def dag_processor_seconds(path: Path, forks: int = 1) -> list[float]:
    return _run(DAG_PROCESSOR.format(path=str(path), plugins=str(ROOT / "plugins"), forks=forks))


def fresh_seconds(path: Path) -> float:
    return _run(FRESH.format(path=str(path), plugins=str(ROOT / "plugins")))[-1]


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
    files.update(site_files(workdir))
    for number, (name, (imports, task)) in enumerate(STOCK.items()):
        files[name] = workdir / f"stock_{number}.py"
        files[name].write_text(STOCK_DAG.replace("IMPORT", imports).replace("TASK", task))
    for path in files.values():
        fresh_seconds(path)  # warm-up: compiles and caches the bytecode
    forked: dict[str, list[float]] = {name: [] for name in files}
    fresh: dict[str, list[float]] = {name: [] for name in files}
    for _ in range(args.repeats):
        for name, path in files.items():
            forked[name] += dag_processor_seconds(path)
            fresh[name].append(fresh_seconds(path))
    processor = {name: statistics.median(values) for name, values in forked.items()}
    interpreter = {name: statistics.median(values) for name, values in fresh.items()}
    print(f"median of {args.repeats} rounds; ratio: against the one-task DAG with the same kind of schedule")
    print(f"{'':<32} {'dag-processor (fork)':>28} {'fresh interpreter':>28}")
    missed = []
    for name, path in files.items():
        # A site's file makes scheduled DAGs too: it is held to the scheduled one-task DAG.
        kind = name.rsplit(", ", 1)[-1] if name.startswith("one-task") else (
            "@daily" if name in SCHEDULED or name.startswith("site ") else "unscheduled")
        base = f"one-task DAG, {kind}"
        ratio, fresh_ratio = processor[name] / processor[base], interpreter[name] / interpreter[base]
        verdict = "" if name.startswith("one-task") else (
            f"  (bound <= {TARGET}: {'met' if ratio <= TARGET else 'MISSED'})")
        print(f"{name:<32} {processor[name] * 1000:9.1f} ms  ratio {ratio:5.2f}   "
              f"{interpreter[name] * 1000:9.1f} ms  ratio {fresh_ratio:5.2f}{verdict}")
        if (path.parent == ROOT / "dags" or name.startswith("site ")) and ratio > TARGET:
            missed.append(name)
    if missed:
        sys.exit(f"over the bound of {TARGET} times a one-task DAG: {', '.join(missed)}")


if __name__ == "__main__":
    main()
