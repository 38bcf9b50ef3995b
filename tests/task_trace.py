"""Which gpuflow files each task runs code in, as ``dag.test()`` runs it: the task's own process and the triggers it
defers to (run in line). docs/architecture.md's task table is checked against it (tests/unit/test_task_map.py reads
the table; the gcp DAG tests record the runs)."""

from __future__ import annotations

import inspect
import sys
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

PACKAGE = Path(__file__).resolve().parents[1] / "plugins" / "gpuflow"
PREFIX = f"{PACKAGE}/"

#: Files every task runs through that a reader need not open to follow one: the configuration model and its
#: loading, the run's configuration derived again and compared with preflight's (operators/run_config.py, the run
#: policy, a batch run's path templates), the shared names, paths and gs:// URI helpers, the catalog's tables, the
#: operators' common base, the platform's factory and its JSON handle, and Airflow-version shims. A row names the
#: files that do the task's own work.
SHARED = frozenset({
    "__init__.py", "paths.py", "gcs_uris.py", "workflow_names.py",
    "configuration/model.py", "configuration/loading.py", "configuration/profiles.py", "configuration/__init__.py",
    "catalog/__init__.py", "runs/naming.py", "runs/run_policy.py", "runs/trigger_form.py", "runs/rollout.py",
    "runs/batch_templates.py",
    "operators/base.py", "operators/run_config.py", "operators/airflow_names.py", "operators/links.py",
    "operators/__init__.py",
    "platform/__init__.py", "platform/base.py", "platform/console.py", "platform/gcp_service.py",
    "platform/gcp_clients.py", "platform/local_service.py", "platform/emulators.py",
    "triggers/__init__.py", "triggers/settle.py", "triggers/kill.py",
    "preflight/__init__.py", "preflight/findings.py",
})


class TaskFileTrace:
    """Records, per task id, the gpuflow files whose functions ran while ``dag.test()`` ran that task."""

    def __init__(self) -> None:
        self.files: dict[str, set[str]] = defaultdict(set)
        self._task: str | None = None

    def install(self, monkeypatch: Any) -> TaskFileTrace:
        import airflow.sdk.definitions.dag as dag_module

        run_task, trace = dag_module._run_task, self

        def traced(*, ti: Any, task: Any, **kwargs: Any) -> Any:
            trace._task = ti.task_id
            previous = sys.gettrace()
            sys.settrace(trace._on_call)
            threading.settrace(trace._on_call)  # a trigger's thread, started while the task runs
            try:
                return run_task(ti=ti, task=task, **kwargs)
            finally:
                sys.settrace(previous)
                threading.settrace(None)  # type: ignore[arg-type]
                trace._task = None

        monkeypatch.setattr(dag_module, "_run_task", traced)
        return self

    def _on_call(self, frame: Any, event: str, arg: Any) -> None:
        code = frame.f_code
        # A function's code, not a module's or a class's body run by an import (CO_NEWLOCALS: functions only)
        if self._task is not None and code.co_flags & inspect.CO_NEWLOCALS and code.co_filename.startswith(PREFIX):
            filename = code.co_filename
            self.files[self._task].add(Path(filename).relative_to(PACKAGE).as_posix())
        return None  # calls only: no line events

    def own_files(self, task_id: str) -> set[str]:
        """What the task ran, shared helpers aside."""
        return self.files[task_id] - SHARED

    def unnamed(self, dag_id: str) -> dict[str, list[str]]:
        """Per task of ``dag_id`` it ran: the files it ran that docs/architecture.md's row for it does not name."""
        from tests.unit.test_task_map import files_named_for

        found = {task: sorted(self.own_files(task) - files_named_for(task, dag_id)) for task in self.files}
        return {task: files for task, files in found.items() if files}
