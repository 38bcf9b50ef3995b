"""The Google Cloud console pages of the jobs gpuflow starts, built in one place for the operators' links."""

from __future__ import annotations

CONSOLE = "https://console.cloud.google.com"


def dataflow_job_url(project: str, region: str, job_id: str) -> str:
    return f"{CONSOLE}/dataflow/jobs/{region}/{job_id}?project={project}"


def vertex_custom_job_url(project: str, job_name: str) -> str:
    """``job_name``: projects/P/locations/L/customJobs/ID, as Vertex AI names a custom job."""
    _, _, location, _, job_id = job_name.split("/")[1:6]
    return f"{CONSOLE}/vertex-ai/locations/{location}/training/{job_id}/cpu?project={project}"


def cloud_build_url(project: str, region: str, build_id: str) -> str:
    return f"{CONSOLE}/cloud-build/builds;region={region}/{build_id}?project={project}"

