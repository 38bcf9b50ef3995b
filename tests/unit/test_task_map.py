"""docs/architecture.md's task table: every task of every DAG has its row, the row's operator is the task's class, and
every file and name the row gives exists where it says, so the files a reader opens are the ones the table names."""

import ast
import inspect
import re
from functools import cache
from pathlib import Path

import pytest

from tests.helpers import ROOT, dag_bag

DOC = ROOT / "docs" / "architecture.md"
PACKAGE = ROOT / "plugins" / "gpuflow"
COLUMNS = ["task", "DAG files", "operator", "both profiles", "local backend", "gcp backend", "waits in",
           "also runs (gcp, traced)"]
REFERENCE = re.compile(r"`([a-z_/]+\.py)(?:::([A-Za-z_.]+))?`")


def task_rows() -> list[dict[str, str]]:
    section = DOC.read_text().split("## Each task and the files it runs", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header == COLUMNS
    return [dict(zip(COLUMNS, (cell.strip() for cell in line.strip("|").split("|")), strict=True))
            for line in lines[2:]]


@cache
def defined_names(path: Path) -> set[str]:
    """Top-level functions and classes of a module, and each class's own methods as Class.method."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names |= {f"{node.name}.{item.name}" for item in node.body if isinstance(item, ast.FunctionDef)}
    return names


def files_named_for(task: str, dag_id: str) -> set[str]:
    """The gpuflow files the table's row for ``task`` of ``dag_id`` names, in any column."""
    rows = [row for row in task_rows() if row["task"] == task and dag_id in row["DAG files"].split(", ")]
    assert len(rows) == 1, f"{len(rows)} rows for task {task} of {dag_id}"
    return {file_name for column in COLUMNS[2:] for file_name, _ in REFERENCE.findall(rows[0][column])}


def missing_references(rows: list[dict[str, str]]) -> list[str]:
    missing = []
    for row in rows:
        for column in COLUMNS[2:]:
            for file_name, name in REFERENCE.findall(row[column]):
                path = PACKAGE / file_name
                if not path.is_file() or (name and name not in defined_names(path)):
                    missing.append(f"{row['task']}: {file_name}::{name}")
    return missing


def test_every_file_and_name_in_the_table_exists():
    assert missing_references(task_rows()) == []


def test_a_moved_or_renamed_backend_is_found():
    rows = [{**dict.fromkeys(COLUMNS, ""), "task": "t", "operator": "`operators/streaming.py::NoSuchOperator`",
             "gcp backend": "`platform/gcp.py::GcpPlatform.no_such_method` `nowhere/gone.py`"}]
    assert missing_references(rows) == ["t: operators/streaming.py::NoSuchOperator",
                                        "t: platform/gcp.py::GcpPlatform.no_such_method", "t: nowhere/gone.py::"]


@pytest.fixture(scope="module")
def dags():
    bag = dag_bag()
    assert bag.import_errors == {}
    return bag.dags


def test_every_task_of_every_dag_has_its_row_with_its_own_operator(dags):
    rows = task_rows()
    found, wrong = [], []
    for dag_id, dag in sorted(dags.items()):
        for task in dag.tasks:
            row = next((row for row in rows if row["task"] == task.task_id
                        and dag_id in re.split(r",\s*", row["DAG files"])), None)
            if row is None:
                found.append(f"{dag_id}.{task.task_id}")
                continue
            operator_file, operator = REFERENCE.search(row["operator"]).groups()
            actual = type(task)
            actual_file = Path(inspect.getfile(actual)).resolve().relative_to(PACKAGE.resolve()).as_posix()
            if (operator_file, operator) != (actual_file, actual.__name__):
                wrong.append(f"{dag_id}.{task.task_id}: {operator_file}::{operator} is {actual_file}::{actual.__name__}")
    assert (found, wrong) == ([], [])


def test_every_row_names_a_task_that_exists(dags):
    tasks = {(dag_id, task.task_id) for dag_id, dag in dags.items() for task in dag.tasks}
    stale = [f"{dag_id}.{row['task']}" for row in task_rows() for dag_id in re.split(r",\s*", row["DAG files"])
             if (dag_id, row["task"]) not in tasks]
    assert stale == []


def test_each_operator_says_what_it_does_on_each_profile_and_what_it_waits_for():
    """An operator's docstring names each profile (or says both do the same) and says what the task waits for."""
    import importlib

    vague = []
    for row in task_rows():
        file_name, name = REFERENCE.search(row["operator"]).groups()
        module = importlib.import_module("gpuflow." + file_name.removesuffix(".py").replace("/", "."))
        doc = (getattr(module, name).__doc__ or "").lower()
        profiles = ("local" in doc and "gcp" in doc) or "both profiles" in doc
        if not (profiles and re.search(r"\bwait", doc)):
            vague.append(name)
    assert vague == []
