"""Vertex AI's JobService: a custom job runs its uploaded script here."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from google.cloud import aiplatform_v1, dataflow_v1beta3

JobState = dataflow_v1beta3.JobState
Importance = dataflow_v1beta3.JobMessageImportance


class FakeVertex:
    """Vertex AI's JobService. A created CustomJob runs: its script is read back from the GCS emulator and run
    here with /gcs/ paths mapped to gs:// (the demo model stands in for a hub download)."""

    def __init__(self, env: dict[str, str] | None = None, demo_model_dir: Path | None = None, fail_with: str = "",
                 running_polls: int = 1):
        self.env, self.demo_model_dir, self.fail_with = env, demo_model_dir, fail_with
        self.running_polls = running_polls  # polls that answer RUNNING before the job ends
        self.requests: list[tuple[str, Any]] = []
        self.polls = 0
        self.created: list[aiplatform_v1.CustomJob] = []  # as created, for list_custom_jobs

    def create_custom_job(self, request):
        assert isinstance(request, aiplatform_v1.CreateCustomJobRequest)
        self.requests.append(("create_custom_job", request))
        if self.env is not None and not self.fail_with:
            self._run(request.custom_job)
        job = aiplatform_v1.CustomJob(request.custom_job)
        job.name = f"{request.parent}/customJobs/4411"
        job.state = aiplatform_v1.JobState.JOB_STATE_PENDING
        self.created.append(job)
        return job

    def list_custom_jobs(self, request):
        """The jobs created under the request's parent that its filter names: ``display_name="..."``, the one form
        of Vertex AI's list filter gpuflow sends (anything else fails the test). Each in its state now."""
        assert isinstance(request, aiplatform_v1.ListCustomJobsRequest)
        self.requests.append(("list_custom_jobs", request))
        found = re.fullmatch(r'display_name="([^"]*)"', request.filter)
        assert found, f"(fake) a filter this fake does not read: {request.filter!r}"
        states = aiplatform_v1.JobState
        state = states.JOB_STATE_RUNNING if self.polls < self.running_polls else \
            states.JOB_STATE_FAILED if self.fail_with else states.JOB_STATE_SUCCEEDED
        return [aiplatform_v1.CustomJob(name=job.name, display_name=job.display_name, labels=job.labels, state=state)
                for job in self.created
                if job.name.startswith(request.parent + "/") and job.display_name == found[1]]

    def _run(self, custom_job) -> None:
        (pool,) = custom_job.job_spec.worker_pool_specs
        command = pool.container_spec.args[0].split(" && ")[-1]
        argv = [a.replace("/gcs/", "gs://", 1) if a.startswith("/gcs/") else a.replace("=/gcs/", "=gs://")
                for a in shlex.split(command)]
        script_uri = argv[1]
        with tempfile.TemporaryDirectory() as scratch:
            script = Path(scratch) / "download_model.py"
            bucket, _, name = script_uri.removeprefix("gs://").partition("/")
            subprocess.run([sys.executable, "-c", "import sys; from google.cloud import storage; storage.Client."
                            "create_anonymous_client().bucket(sys.argv[1]).blob(sys.argv[2]).download_to_filename("
                            "sys.argv[3])", bucket, name, str(script)], env=self.env, check=True)
            model_arg = next(a for a in argv if a.startswith("--model-name="))
            model_name = model_arg.split("=", 1)[1]
            args = [a if a != model_arg else f"--model-name={self.demo_model_dir}" for a in argv[2:]]
            subprocess.run([sys.executable, str(script), *args, "--record-as", model_name], env=self.env, check=True,
                           capture_output=True)

    def get_custom_job(self, request):
        assert isinstance(request, aiplatform_v1.GetCustomJobRequest)
        self.requests.append(("get_custom_job", request))
        self.polls += 1
        states = aiplatform_v1.JobState
        if any(name == "cancel_custom_job" and r.name == request.name for name, r in self.requests):
            state = states.JOB_STATE_CANCELLED  # "the job's state is set to CANCELLED" once it stops (JobService)
        elif self.polls <= self.running_polls:
            state = states.JOB_STATE_RUNNING
        else:
            state = states.JOB_STATE_FAILED if self.fail_with else states.JOB_STATE_SUCCEEDED
        job = aiplatform_v1.CustomJob(name=request.name, state=state)
        if self.fail_with:
            job.error.message = self.fail_with
        return job

    def cancel_custom_job(self, request):
        assert isinstance(request, aiplatform_v1.CancelCustomJobRequest)
        self.requests.append(("cancel_custom_job", request))
