"""Read the job request Dataflow would receive without reaching Google: Beam's own DataflowRunner stages the job
with ``--template_location`` into a local GCS emulator (and ``--no_auth``, so it asks for no credentials), and the
request it writes there is read back. ``gpuflow launch-command --check`` checks it against Dataflow's documented
constraints; nothing is launched and no Google Cloud project is touched. It takes about half a minute, most of it
Beam 2.77's own retries for Application Default Credentials, which it asks for even with ``--no_auth``."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import tempfile
from typing import Any

from gpuflow.configuration.model import GpuflowConfig
from gpuflow.dataflow.options import runtime_environment, staging_command, template_uri_for
from gpuflow.dataflow.request import DataflowRequest, from_staged_job, with_template_launch
from gpuflow.runs.naming import ResourceNames

log = logging.getLogger(__name__)


class OfflineStagingFailed(RuntimeError):
    pass


def stage_offline(config: GpuflowConfig, names: ResourceNames, script: str, argv: list[str], image: str,
                  job_name: str, streaming: bool, image_cuda: int | None) -> DataflowRequest:
    """The staged job, with the template launch's environment on top, as ``DataflowJobs.start_template`` checks it."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    from gpuflow.platform.emulators import running_emulators

    with tempfile.TemporaryDirectory(prefix="gpuflow-check-") as scratch, running_emulators(config, scratch) as env:
        client = storage.Client(project=config.project, credentials=AnonymousCredentials())
        if not client.bucket(names.bucket).exists():
            client.create_bucket(names.bucket)
        command = [*staging_command(config, names, script, argv, image, job_name, streaming), "--no_auth"]
        log.info("staging %s offline with Beam's DataflowRunner into the GCS emulator", job_name)
        # NO_GCE_CHECK: no probe of a metadata server (there is none to reach; google-auth's probe waits for it).
        done = subprocess.run(command, env={**os.environ, **env, "NO_GCE_CHECK": "True"}, capture_output=True,
                              text=True, timeout=600, stdin=subprocess.DEVNULL)
        if done.returncode:
            raise OfflineStagingFailed(f"Beam could not stage {job_name} offline (exit {done.returncode}):\n"
                                       f"{done.stderr[-4000:]}")
        template = _download(client, template_uri_for(names, job_name))
        options: dict[str, Any] = template["environment"]["sdkPipelineOptions"]["options"]
        proto = _download(client, options["pipelineUrl"], as_json=False) if options.get("pipelineUrl") else None
    staged = from_staged_job(template, proto, image_cuda)
    return with_template_launch(staged, runtime_environment(config, names, streaming))


def _download(client: Any, uri: str, as_json: bool = True) -> Any:
    bucket, _, blob = uri.removeprefix("gs://").partition("/")
    data = client.bucket(bucket).blob(blob).download_as_bytes()
    return json.loads(data) if as_json else data
