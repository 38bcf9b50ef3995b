"""The local jobs' Cloud Storage through Beam's GCS filesystem (beam_jobs/storage_emulator.py), on the real storage
emulator: in a process of its own, as a local job runs, Beam's client is anonymous at once and reads and writes."""

import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SCRIPT = textwrap.dedent("""
    import sys, time
    from apache_beam.io.gcp import gcsio
    from apache_beam.options.pipeline_options import PipelineOptions
    from storage_emulator import connect_anonymously
    assert connect_anonymously()
    started = time.monotonic()
    io = gcsio.GcsIO(pipeline_options=PipelineOptions(["--project=gpuflow-local"]))
    with io.open(sys.argv[1], "w") as f:
        f.write(b"written through Beam")
    assert io.open(sys.argv[1]).read() == b"written through Beam"
    print(round(time.monotonic() - started, 2))
""")


def beam_gcs_seconds(uri: str) -> float:
    import os

    from gpuflow.paths import project_path

    env = {**os.environ, "PYTHONPATH": str(project_path("beam_jobs"))}
    env.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
    done = subprocess.run([sys.executable, "-c", SCRIPT, uri], env=env, capture_output=True, text=True,
                          timeout=100, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def test_beams_gcs_client_reaches_the_emulator_without_waiting_for_credentials(emulators, local_config):
    from airflow.providers.google.cloud.hooks.gcs import GCSHook

    from gpuflow.platform.emulators import LOCAL_CONN_ID, emulator_environment

    bucket = f"beam-anonymous-{time.monotonic_ns():x}"
    with emulator_environment(local_config):
        GCSHook(gcp_conn_id=LOCAL_CONN_ID).create_bucket(bucket_name=bucket, project_id=local_config.project)
        seconds = beam_gcs_seconds(f"gs://{bucket}/a.txt")
    # Beam's own way waits for google.auth.default() and its four retries first: 23 s here
    assert seconds < 5, seconds
