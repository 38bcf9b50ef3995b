"""The GCS emulator read and written from a child process with its own environment (as Dataflow and Vertex AI would
read what gpuflow staged)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys

from google.cloud import dataflow_v1beta3

JobState = dataflow_v1beta3.JobState
Importance = dataflow_v1beta3.JobMessageImportance


def read_gcs(env: dict[str, str], uri: str) -> str:
    return subprocess.run([sys.executable, "-c", "import sys; from google.cloud import storage; b, _, n = "
                           "sys.argv[1].removeprefix('gs://').partition('/'); print(storage.Client."
                           "create_anonymous_client().bucket(b).blob(n).download_as_text())", uri],
                          env=env, check=True, capture_output=True, text=True).stdout


def read_staged_job(env: dict[str, str], uri: str):
    """The job request Beam staged at ``uri`` and the Beam pipeline proto it names (pipelineUrl), read in one
    process: what Dataflow reads when it launches a template."""
    from apache_beam.portability.api import beam_runner_api_pb2

    script = ("import base64, json, sys\nfrom google.cloud import storage\n"
              "client = storage.Client.create_anonymous_client()\n"
              "def read(uri):\n    bucket, _, name = uri.removeprefix('gs://').partition('/')\n"
              "    return client.bucket(bucket).blob(name).download_as_bytes()\n"
              "job = read(sys.argv[1])\n"
              "url = json.loads(job)['environment']['sdkPipelineOptions']['options']['pipelineUrl']\n"
              "print(base64.b64encode(job).decode(), base64.b64encode(read(url)).decode())")
    job, proto = subprocess.run([sys.executable, "-c", script, uri], env=env, check=True, capture_output=True,
                                text=True).stdout.split()
    return json.loads(base64.b64decode(job)), beam_runner_api_pb2.Pipeline.FromString(base64.b64decode(proto))


def write_gcs(env: dict[str, str], uri: str, text: str) -> None:
    subprocess.run([sys.executable, "-c", "import sys; from google.cloud import storage; b, _, n = "
                    "sys.argv[1].removeprefix('gs://').partition('/'); storage.Client.create_anonymous_client()"
                    ".bucket(b).blob(n).upload_from_string(sys.argv[2])", uri, text], env=env, check=True)


def file_patterns(pipeline) -> dict[str, str]:
    """The file each text read and write names, from the transforms' display data: what the job reads and writes."""
    from apache_beam.portability.api import beam_runner_api_pb2

    patterns = {}
    for transform in pipeline.components.transforms.values():
        for item in transform.display_data:
            payload = beam_runner_api_pb2.LabelledPayload.FromString(item.payload)
            if payload.key == "file_pattern":  # on the composite's parts: ReadPrompts/Read, WriteAnswers/Write/...
                patterns[transform.unique_name.split("/")[0]] = payload.string_value
    return patterns
