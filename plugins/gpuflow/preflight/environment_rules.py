"""Environment rules: what a workflow needs of the machine its preflight runs on (this Python and Beam, Airflow at
gpuflow's floor, the Google Cloud connection, the local emulators, Java for local Spark). Configuration rules, which
look at the configuration alone, are ``preflight.rules``."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from importlib import metadata

from gpuflow.configuration.model import GpuflowConfig
from gpuflow.preflight.findings import Finding, error, info


def launch_environment_matches_container(config: GpuflowConfig) -> Iterator[Finding]:
    """The launcher pickles the pipeline; the container must unpickle it with the same Beam and Python.

    Only in launch.mode direct: a Flex Template launches from the worker image itself."""
    if config.launch_mode == "flex_template" and config.traits.dataflow_workers:
        chosen = "launch.mode" if config.launch.mode else "the gcp profile's default launch mode"
        yield info("launch.mode", f"flex_template ({chosen}): Dataflow stages the job with the worker image's own "
                   f"Beam {config.beam_version} and Python {config.python_version}, so this environment's Beam is "
                   "not used and not compared with the lock",
                   "launch.mode: direct stages it here instead (this environment's Beam and Python must then match "
                   "the image's)")
        return
    local_python = f"{sys.version_info.major}.{sys.version_info.minor}"
    if local_python != config.python_version:
        yield error(
            "python_version",
            f"the launch environment runs Python {local_python} but the container is built for "
            f"{config.python_version}; workers then fail with 'SystemError: unknown opcode' or pickler errors",
            f"set python_version: '{local_python}' (the image is built with it), or use launch.mode: flex_template "
            "(the image launches the job itself)",
        )
    try:
        local_beam = metadata.version("apache-beam")
    except metadata.PackageNotFoundError:
        yield error("beam_version", "apache-beam is not installed in the launch environment",
                    "install requirements.txt in the Airflow environment")
        return
    if local_beam != config.beam_version:
        yield error(
            "beam_version",
            f"the launch environment has Beam {local_beam} but the container is built for {config.beam_version}",
            f"set beam_version: '{local_beam}' (the image is built with it), or use launch.mode: flex_template (the "
            "image launches the job itself); on Cloud Composer never replace the environment's Beam",
        )


def airflow_at_floor(config: GpuflowConfig) -> Iterator[Finding]:
    """Airflow and its providers where the task runs: at least the Composer floor gpuflow is tested on."""
    from gpuflow.catalog import composer_floor, version_tuple

    floor = composer_floor()
    for package, oldest in floor["packages"].items():
        try:
            installed = metadata.version(package)
        except metadata.PackageNotFoundError:
            installed = None
        if installed is None or version_tuple(installed.split("+", 1)[0]) < version_tuple(oldest):
            yield error("profile", f"{package} {installed or '(not installed)'} is below gpuflow's floor {oldest}, "
                        f"the oldest tested (Composer 3 with Airflow {floor['packages']['apache-airflow']})",
                        f"on Composer: gcloud composer environments update ENVIRONMENT --location LOCATION "
                        f"--image-version {floor['newest_image']}; elsewhere: pip install '{package}>={oldest}'")


def gcp_connection_defined(config: GpuflowConfig) -> Iterator[Finding]:
    """The gcp profile's hooks read this Airflow connection; a missing one would fail after setup began."""
    try:
        from airflow.sdk import BaseHook

        BaseHook.get_connection(config.gcp_conn_id)
    except Exception as problem:  # AirflowNotFoundException, or no Airflow metadata to read it from
        yield error("gcp_conn_id", f"the Airflow connection {config.gcp_conn_id!r} cannot be read ({problem})",
                    connection_fix(config.gcp_conn_id, in_task=_in_a_task()))


def connection_fix(conn_id: str, *, in_task: bool) -> str:
    """The fix that works where preflight runs.

    A task reads connections through Airflow's execution API, so one added to Airflow's database serves. A shell
    (``gpuflow preflight``) is outside any Airflow process: Airflow 3's Task SDK then reads connections from
    environment variables and configured secrets backends only, never from the database
    (airflow.sdk.execution_time.supervisor.ensure_secrets_backend_loaded), so there an environment variable, in
    the JSON form of Airflow's "Managing Connections" page, is the fix that works.
    """
    extra = '{"project": "PROJECT"}'
    if in_task:
        return (f"add it where Airflow keeps connections: airflow connections add {conn_id} --conn-type "
                f"google_cloud_platform --conn-extra '{extra}' (on the Airflow machine, after airflow db migrate), "
                "or the UI's Admin > Connections (on Composer too)")
    variable = "AIRFLOW_CONN_" + conn_id.upper()
    return (f"export {variable}='{{\"conn_type\": \"google_cloud_platform\", \"extra\": {extra}}}' in this "
            "shell (outside a task, Airflow reads connections from environment variables and secrets backends, "
            "not from its database)")


def _in_a_task() -> bool:
    from airflow.sdk import get_current_context

    try:
        get_current_context()
    except Exception:  # "Current context was requested but no context was found!"
        return False
    return True


def emulators_answer(config: GpuflowConfig) -> Iterator[Finding]:
    from gpuflow.platform.emulators import pubsub_answers, storage_answers

    if not pubsub_answers(config):
        yield error(
            "local.pubsub_emulator_host",
            f"no Pub/Sub emulator answers at {config.local.pubsub_emulator_host}",
            "start the emulators with `gpuflow emulators start` (or run through `make demo`)",
        )
    if not storage_answers(config):
        yield error(
            "local.storage_emulator_host",
            f"no GCS emulator answers at {config.local.storage_emulator_host}",
            "start the emulators with `gpuflow emulators start` (or run through `make demo`)",
        )


def java_for_local_spark(config: GpuflowConfig) -> Iterator[Finding]:
    import shutil

    if shutil.which("java") is None:
        yield error("profile", "local Spark needs Java (17) and there is no java on PATH",
                    "install a Java 17 runtime (Debian: openjdk-17-jre-headless)")
