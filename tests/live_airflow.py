"""Airflow 3's own processes on a temporary Airflow home and loopback ports, for tests that use Airflow as a
person does: the api-server (REST API and UI), the scheduler (LocalExecutor), the dag-processor and the triggerer
(where deferred tasks wait).

Every process is started in its own session and stopped by its pid (the whole group), so nothing is left.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

from tests.helpers import ROOT

USERNAME = "gpuflow-admin"
#: A user whose role may trigger DAGs and nothing more than Airflow's SimpleAuthManager gives that role ("user": it
#: may also edit XComs and clear task instances, is_authorized_dag), as the security tests act.
TRIGGER_USER = "gpuflow-trigger"


#: Airflow's services, all of which a person's Airflow runs.
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
#: The pool of the tasks that start GPU jobs, as docs/gcp.md tells a person to create it.
POOL = ("pools", "set", "gpuflow_gpu", "1", "gpuflow: GPU jobs start one at a time", "--include-deferred")


def database_name(home: Path) -> str:
    """The Airflow home's own database: one per home, on the session's server (which xdist's workers share)."""
    return f"airflow_{os.getpid()}_" + "".join(c if c.isalnum() else "_" for c in home.name.lower())


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class LiveAirflow:
    home: Path
    database_url: str  # the home's own PostgreSQL database (tests/postgres.py): Airflow's services never on SQLite
    port: int = field(default_factory=free_port)
    password: str = field(default_factory=lambda: secrets.token_urlsafe(12))
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    dags_folder: Path = ROOT / "dags"
    extra_env: dict[str, str] = field(default_factory=dict)  # for every process, after Airflow's own settings

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        return {
            **{key: value for key, value in os.environ.items() if key != "GPUFLOW_TRIGGER_SETTLE_S"},
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "2",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.database_url,
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__BASE_URL": self.url,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.url}/execution/",
            "AIRFLOW__API_AUTH__JWT_SECRET": "gpuflow-test-" + self.password,
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USERNAME}:admin,{TRIGGER_USER}:user",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.home / "passwords.json"),
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL": "5",
            **self.extra_env,
        }

    def start(self, timeout_s: float = 180, components: tuple[str, ...] = COMPONENTS,
              setup: tuple[tuple[str, ...], ...] = (POOL,)) -> None:
        """Migrate the database, run each ``setup`` command of Airflow's CLI, then start ``components``."""
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "passwords.json").write_text(json.dumps({USERNAME: self.password, TRIGGER_USER: self.password}))
        env = self.env()
        for command in (("db", "migrate"), *setup):
            done = subprocess.run([sys.executable, "-m", "airflow", *command], env=env, capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"airflow {' '.join(command[:2])} failed: {(done.stdout + done.stderr)[-3000:]}")
        for name in components:
            self.start_process(name, env)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise RuntimeError(f"airflow {name} exited: {self.log_tail(name)}")
            try:
                if requests.get(f"{self.url}/api/v2/monitor/health", timeout=2).ok:
                    return
            except requests.RequestException:  # not listening yet, or listening but still starting (a read timeout)
                pass
            time.sleep(1)
        raise TimeoutError(f"the api-server did not answer within {timeout_s}s: {self.log_tail('api-server')}")

    def start_process(self, name: str, env: dict[str, str] | None = None) -> None:
        log = open(self.home / f"{name}.log", "ab")  # noqa: SIM115 - lives with the process
        self.processes[name] = subprocess.Popen([sys.executable, "-m", "airflow", name], env=env or self.env(),
                                                stdout=log,
                                                stderr=subprocess.STDOUT, start_new_session=True)

    def restart(self, name: str) -> None:
        """Stop one process as Kubernetes stops a pod that Composer moves, and start another."""
        self.stop_process(name)
        self.start_process(name, self.env())

    def stop_process(self, name: str) -> None:
        """SIGTERM to the process (a container's main process), SIGKILL to what is left after a grace period."""
        from gpuflow.platform.emulators import stop_process_group

        process = self.processes[name]
        process.terminate()
        try:
            process.wait(timeout=30)
        finally:
            stop_process_group(process.pid, grace_s=5)  # what the main process left behind, as the pod's end does

    def kill_and_replace(self, name: str) -> None:
        """SIGKILL one process and everything it started (a pod lost without notice), then start another."""
        import signal

        process = self.processes[name]
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        self.start_process(name, self.env())

    def log_tail(self, name: str, lines: int = 40) -> str:
        path = self.home / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def stop(self) -> None:
        """SIGTERM to every component at once (they shut down side by side, not one grace period after another),
        then SIGKILL to what is left of them after 20 s."""
        from gpuflow.platform.emulators import process_alive, stop_process_groups

        stop_process_groups([process.pid for process in self.processes.values()], grace_s=20)
        for process in self.processes.values():
            process.wait(timeout=30)
        leftovers = [name for name, process in self.processes.items() if process_alive(process.pid)]
        assert not leftovers, f"still running: {leftovers}"

    # -- the REST API, authenticated as the UI is: a JWT from /auth/token --------------------------------------

    def token(self, user: str = USERNAME) -> str:
        answer = requests.post(f"{self.url}/auth/token", json={"username": user, "password": self.password},
                               timeout=30)
        answer.raise_for_status()
        return answer.json()["access_token"]

    def api(self, method: str, path: str, attempts: int = 3, user: str = USERNAME, **kwargs) -> requests.Response:
        """One REST call as ``user``; asked again when the api-server, on two busy cores, does not answer in
        time."""
        for attempt in range(1, attempts + 1):
            try:
                headers = {"Authorization": f"Bearer {self.token(user)}"}
                return requests.request(method, f"{self.url}/api/v2{path}", headers=headers, timeout=30, **kwargs)
            except (requests.Timeout, requests.ConnectionError) as problem:
                # a read timeout may come after a POST took effect: only a GET, or a request never sent, again
                sent = isinstance(problem, requests.ReadTimeout)
                if attempt == attempts or (sent and method != "GET"):
                    raise
                time.sleep(2)

    def wait_for_dag(self, dag_id: str, timeout_s: float = 180) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            answer = self.api("GET", f"/dags/{dag_id}")
            if answer.ok:
                if answer.json().get("is_paused"):
                    self.api("PATCH", f"/dags/{dag_id}", json={"is_paused": False}).raise_for_status()
                return answer.json()
            time.sleep(1)
        raise TimeoutError(f"{dag_id} was not parsed within {timeout_s}s: {self.log_tail('dag-processor')}")

    def wait_for_new_run(self, dag_id: str, known: set[str], timeout_s: float = 60) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            runs = self.api("GET", f"/dags/{dag_id}/dagRuns").json()["dag_runs"]
            new = [run["dag_run_id"] for run in runs if run["dag_run_id"] not in known]
            if new:
                return new[0]
            time.sleep(1)
        raise TimeoutError(f"no new run of {dag_id} appeared within {timeout_s}s")

    def wait_for_task_state(self, dag_id: str, run_id: str, task_id: str, state: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ti = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}").json()
            if ti.get("state") == state:
                return
            time.sleep(0.5)
        raise TimeoutError(f"{task_id} of {run_id} was not {state} within {timeout_s}s: {ti}")

    def wait_for_run(self, dag_id: str, run_id: str, timeout_s: float,
                     states_seen: dict[str, set[str]] | None = None) -> dict:
        """The finished run; ``states_seen`` collects every state each task was seen in while it ran."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            run = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}").json()
            if run["state"] in ("success", "failed"):
                return run
            if states_seen is not None:
                listing = self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances").json()
                for ti in listing["task_instances"]:
                    states_seen.setdefault(ti["task_id"], set()).add(ti["state"])
            time.sleep(1)
        raise TimeoutError(f"run {run_id} did not finish within {timeout_s}s: {self.log_tail('scheduler')}")

    def wait_for_backfill_runs(self, dag_id: str, days: list[str], timeout_s: float) -> list[dict]:
        """The backfill runs of ``days`` (YYYY-MM-DD logical dates), once every one of them has finished and the
        scheduler has closed the backfill."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            listing = self.api("GET", f"/dags/{dag_id}/dagRuns", params={"run_type": "backfill", "limit": 100})
            runs = [run for run in listing.json()["dag_runs"] if (run.get("logical_date") or "")[:10] in days]
            backfills = self.api("GET", "/backfills", params={"dag_id": dag_id}).json()["backfills"]
            if len(runs) == len(days) and all(run["state"] in ("success", "failed") for run in runs) and all(
                    backfill["completed_at"] for backfill in backfills):  # (one backfill of a DAG at a time)
                return runs
            time.sleep(1)
        raise TimeoutError(f"the backfill of {days} did not finish within {timeout_s}s: {self.log_tail('scheduler')}")

