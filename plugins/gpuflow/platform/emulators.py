"""The local profile's stand-ins for Google Cloud: the official Pub/Sub emulator and a GCS emulator.

Both speak the real APIs, so the Airflow Google provider's hooks and Beam's Pub/Sub and GCS
I/O work against them unchanged once the environment below is set.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from gpuflow.configuration.model import GpuflowConfig

log = logging.getLogger(__name__)

#: The Airflow connection the local profile's hooks use; defined by ``emulator_environment``.
LOCAL_CONN_ID = "gpuflow_emulators"


class EmulatorError(RuntimeError):
    pass


def _pubsub_url(config: GpuflowConfig) -> str:
    return f"http://{config.local.pubsub_emulator_host}"


def _storage_url(config: GpuflowConfig) -> str:
    return config.local.storage_emulator_host.rstrip("/")


def _answers(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return bool(response.status < 500)
    except urllib.error.HTTPError as error:
        return error.code < 500
    except (OSError, ValueError):
        return False


def pubsub_answers(config: GpuflowConfig) -> bool:
    return _answers(_pubsub_url(config))


def storage_answers(config: GpuflowConfig) -> bool:
    return _answers(f"{_storage_url(config)}/storage/v1/b?project={config.project}")


def emulator_env(config: GpuflowConfig) -> dict[str, str]:
    """Environment that points Google clients, Beam and the Airflow hooks at the emulators."""
    connection = {
        "conn_type": "google_cloud_platform",
        "extra": {"is_anonymous": True, "project": config.project},
    }
    return {
        "PUBSUB_EMULATOR_HOST": config.local.pubsub_emulator_host,
        "PUBSUB_PROJECT_ID": config.project,
        "STORAGE_EMULATOR_HOST": _storage_url(config),
        "GOOGLE_CLOUD_PROJECT": config.project,
        f"AIRFLOW_CONN_{LOCAL_CONN_ID.upper()}": json.dumps(connection),
    }


@contextlib.contextmanager
def emulator_environment(config: GpuflowConfig) -> Iterator[dict[str, str]]:
    """Set ``emulator_env`` in this process for the duration, then restore what was there."""
    values = emulator_env(config)
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield values
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


@dataclass
class EmulatorProcesses:
    """Emulators this process started (and therefore stops); ones already running are left alone."""

    config: GpuflowConfig
    log_dir: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, timeout_s: float = 120) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if not pubsub_answers(self.config):
            gcloud = shutil.which("gcloud")
            if not gcloud:
                raise EmulatorError(
                    "gcloud is not on PATH. Fix: install the Google Cloud CLI with the beta and "
                    "pubsub-emulator components (Debian: google-cloud-cli-pubsub-emulator)."
                )
            self._spawn(
                "pubsub",
                [gcloud, "beta", "emulators", "pubsub", "start", "--quiet",
                 f"--host-port={self.config.local.pubsub_emulator_host}", f"--project={self.config.project}"],
            )
        if not storage_answers(self.config):
            host_port = _storage_url(self.config).split("://", 1)[-1]
            host, _, port = host_port.partition(":")
            self._spawn(
                "storage",
                [sys.executable, "-m", "gcp_storage_emulator", "start", f"--host={host}", f"--port={port or 9023}",
                 "--in-memory"],
            )
        self.wait_until_ready(timeout_s)

    def _spawn(self, name: str, command: list[str]) -> None:
        log.info("starting the %s emulator: %s", name, " ".join(command))
        log_file = open(self.log_dir / f"{name}-emulator.log", "ab")  # noqa: SIM115 - lives with the process
        self.processes[name] = subprocess.Popen(
            command, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )

    def wait_until_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        checks = {"pubsub": pubsub_answers, "storage": storage_answers}
        while time.monotonic() < deadline:
            waiting = [name for name, check in checks.items() if not check(self.config)]
            if not waiting:
                log.info("emulators ready: %s", emulator_env(self.config)["PUBSUB_EMULATOR_HOST"])
                return
            for name in waiting:
                process = self.processes.get(name)
                if process is not None and process.poll() is not None:
                    raise EmulatorError(
                        f"the {name} emulator exited with code {process.returncode}; "
                        f"see {self.log_dir / f'{name}-emulator.log'}"
                    )
            time.sleep(0.5)
        raise EmulatorError(f"emulators did not answer within {timeout_s:.0f}s; logs in {self.log_dir}")

    def stop(self) -> None:
        running = {name: process for name, process in self.processes.items() if process.poll() is None}
        for name, process in running.items():
            log.info("stopping the %s emulator (pid %d)", name, process.pid)
        stop_process_groups([process.pid for process in running.values()])
        for process in running.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
        self.processes.clear()


def stop_process_group(pid: int, grace_s: float = 10.0) -> bool:
    """SIGTERM the process group led by ``pid``, SIGKILL it after ``grace_s``. True if it was running."""
    return bool(stop_process_groups([pid], grace_s))


def stop_process_groups(pids: Iterable[int], grace_s: float = 10.0) -> list[int]:
    """SIGTERM every process group led by one of ``pids`` at once, each once, and SIGKILL what is left of them when
    one shared ``grace_s`` has passed: they shut down side by side, not one grace period after another. The pids that
    were running."""
    running = [pid for pid in pids if _terminate_group(pid)]
    deadline = time.monotonic() + grace_s
    left = [pid for pid in running if process_alive(pid)]
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = [pid for pid in left if process_alive(pid)]
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    return running


def _terminate_group(pid: int) -> bool:
    """SIGTERM to the group led by ``pid`` (to the process alone where the group may not be signalled). False if it
    is gone."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    except PermissionError:
        os.kill(pid, signal.SIGTERM)
    return True


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by its parent) is not alive for our purposes.
    with contextlib.suppress(OSError):
        status = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
        return status != "Z"
    return True


@contextlib.contextmanager
def running_emulators(config: GpuflowConfig, log_dir: Path | str) -> Iterator[dict[str, str]]:
    """Start whatever emulator does not answer yet, set the environment, stop what was started."""
    processes = EmulatorProcesses(config, Path(log_dir))
    try:
        processes.start()
        with emulator_environment(config) as env:
            yield env
    finally:
        processes.stop()
