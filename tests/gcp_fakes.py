"""Google Cloud services that no machine here can reach, faked at the client boundary.

Each fake takes the request object gpuflow's gcp platform sends, asserts that it is the API's own type
(``dataflow_v1beta3``, ``aiplatform_v1``, ``cloudbuild_v1``, ``artifactregistry_v1``, ``compute_v1``),
records it, and answers with the API's own response types, replaying the state sequences the services go
through. Where a real service would do work that later steps read back (Vertex AI writes the weights,
Dataflow workers run the pipeline and write the GPU report), the fake does that work on this machine:
the weights are exported by the uploaded script into the GCS emulator, and the streaming pipeline runs on
Beam's BundleBasedDirectRunner against the Pub/Sub emulator. Only the control planes are fake.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from google.api_core.exceptions import FailedPrecondition, GoogleAPICallError, NotFound
from google.cloud import aiplatform_v1, artifactregistry_v1, compute_v1, dataflow_v1beta3, monitoring_v3
from google.cloud.dataflow_v1beta3.services.messages_v1_beta3 import pagers
from google.cloud.devtools import cloudbuild_v1

from tests.helpers import ROOT

JobState = dataflow_v1beta3.JobState
Importance = dataflow_v1beta3.JobMessageImportance

#: A report as beam_jobs/gpu_check.py writes it on a g2-standard-4 worker with its L4.
L4_WORKER_REPORT = {
    "host": "gf-gpu-check-11290001-harness-x7k2", "python": "3.11.7", "errors": [],
    "torch": {"version": "2.13.0+cu128", "cuda_build": "12.8", "cuda_available": True, "devices": ["NVIDIA L4"]},
    "tensorflow": None, "nvidia_smi": ["GPU 0: NVIDIA L4 (UUID: GPU-5f1c)"], "gpu_found": True,
}

WORKERS_STARTED = "Workers have started successfully."
ALL_WORKERS_STARTED = ("All workers have finished the startup processes and began to receive work requests.")
#: A script entry (AUTOSCALING, n) is an autoscaling event: the job's worker pool now has n workers.
AUTOSCALING = "autoscaling"
#: Dataflow's importance order (the enum's numbers are not in it): minimum_importance keeps this and above.
IMPORTANCE_ORDER = [Importance.JOB_MESSAGE_DEBUG, Importance.JOB_MESSAGE_DETAILED, Importance.JOB_MESSAGE_BASIC,
                    Importance.JOB_MESSAGE_WARNING, Importance.JOB_MESSAGE_ERROR]
EXHAUSTED = ("Startup of the worker pool in zone us-central1-a failed to bring up any of the desired 1 workers. "
             "ZONE_RESOURCE_POOL_EXHAUSTED: Instance 'gf-llm-inference-11290001-harness-0' creation failed: The zone "
             "'projects/gpuflow-gcp-test/zones/us-central1-a' does not have enough resources available to fulfill "
             "the request. Try a different zone, or try again later.")

# A job's script: what each successive get_job answers (the last step repeats), with the messages and
# autoscaling events that appear. Shaped like real Dataflow logs: the start messages at DETAILED importance.
STREAMING_STARTS = [(JobState.JOB_STATE_PENDING, []), (JobState.JOB_STATE_QUEUED, []),
                    (JobState.JOB_STATE_RUNNING, [(Importance.JOB_MESSAGE_BASIC, "Worker configuration: g2-standard-4 "
                                                   "in us-central1-b.")]),
                    (JobState.JOB_STATE_RUNNING, [(Importance.JOB_MESSAGE_DETAILED, WORKERS_STARTED),
                                                  (Importance.JOB_MESSAGE_DETAILED, ALL_WORKERS_STARTED)])]
#: The same start seen only through the autoscaling events (no start message).
STREAMING_STARTS_BY_AUTOSCALING = [(JobState.JOB_STATE_PENDING, []),
                                   (JobState.JOB_STATE_RUNNING, [(AUTOSCALING, 0)]),
                                   (JobState.JOB_STATE_RUNNING, [(AUTOSCALING, 1)])]
BATCH_SUCCEEDS = [(JobState.JOB_STATE_PENDING, []), (JobState.JOB_STATE_RUNNING, [(Importance.JOB_MESSAGE_DETAILED,
                                                                                     WORKERS_STARTED)]),
                  (JobState.JOB_STATE_DONE, [])]
ZONE_EXHAUSTED = [(JobState.JOB_STATE_PENDING, []),
                  (JobState.JOB_STATE_RUNNING, [(Importance.JOB_MESSAGE_ERROR, EXHAUSTED)])]
LAUNCH_FAILS = [(JobState.JOB_STATE_PENDING, []),
                (JobState.JOB_STATE_FAILED, [(Importance.JOB_MESSAGE_ERROR,
                                              "Workflow failed. Causes: Error syncing pod: SystemError: unknown opcode")])]


#: What Dataflow's ACTIVE filter leaves out: the terminal states, UPDATED (replaced in place) and STOPPED among them.
TERMINAL_STATES = {JobState.JOB_STATE_DONE, JobState.JOB_STATE_FAILED, JobState.JOB_STATE_CANCELLED,
                   JobState.JOB_STATE_DRAINED, JobState.JOB_STATE_UPDATED, JobState.JOB_STATE_STOPPED}


@dataclass
class FakeJob:
    id: str
    name: str
    location: str
    gcs_path: str
    script: list
    step: int = -1
    messages: list = field(default_factory=list)
    stopped_state: Any = None
    process: subprocess.Popen | None = None
    labels: dict = field(default_factory=dict)  # as the launch request stated them
    # What the request launched: the program (llm_inference or gpu_check) and whether it streams, read from the
    # staged job (its type and pipeline proto) or from the Flex Template launch's parameters, never from the name.
    program: str = "llm_inference"
    streaming: bool = True

    autoscaling_events: list = field(default_factory=list)
    stopping: list = field(default_factory=list)  # the states a stop passes through, the last one kept

    def advance(self) -> Any:
        if self.stopping:
            self.stopped_state = self.stopping.pop(0) if len(self.stopping) > 1 else self.stopping[0]
        if self.stopped_state is not None:
            return self.stopped_state
        self.step = min(self.step + 1, len(self.script) - 1)
        state, messages = self.script[self.step]
        for importance, text in messages:
            if importance == AUTOSCALING:  # (AUTOSCALING, n): the worker pool reached n workers
                if all(e.current_num_workers != text for e in self.autoscaling_events):
                    self.autoscaling_events.append(dataflow_v1beta3.AutoscalingEvent(
                        current_num_workers=text, target_num_workers=text,
                        event_type=dataflow_v1beta3.AutoscalingEvent.AutoscalingEventType.CURRENT_NUM_WORKERS_CHANGED,
                        description={"message_text": f"Autoscaling: Raised the number of workers to {text}."},
                        time={"seconds": 1_795_000_000 + len(self.autoscaling_events)}))
            elif all(m.message_text != text for m in self.messages):
                self.messages.append(dataflow_v1beta3.JobMessage(
                    id=f"{self.id}-m{len(self.messages)}", message_text=text, message_importance=importance))
        return state


class FakeDataflow:
    """Dataflow's Templates, Jobs and Messages services.

    ``scripts`` hands each launched job its state sequence, in launch order (missing: a streaming job that
    starts, or a batch job that succeeds). ``workers`` runs what the job's workers would run.
    """

    def __init__(self, workers: FakeWorkers | None = None):
        self.requests: list[tuple[str, Any]] = []
        self.staged: dict[str, dict] = {}  # template gs:// path -> the job request Beam staged there, as launched
        self.jobs: dict[str, FakeJob] = {}
        self.scripts: list[list] = []
        self.workers = workers
        self._ids = itertools.count(1)

    # TemplatesServiceClient
    def launch_template(self, request):
        """Dataflow reads the template Beam staged: the job's type, and its pipeline (which program it runs)."""
        assert isinstance(request, dataflow_v1beta3.LaunchTemplateRequest)
        self.requests.append(("launch_template", request))
        staged, proto = read_staged_job(self.workers.env if self.workers else dict(os.environ), request.gcs_path)
        self.staged[request.gcs_path] = staged  # kept: cleanup deletes the run's prefix
        transforms = {transform.unique_name for transform in proto.components.transforms.values()}
        program = "gpu_check" if any(name.split("/")[-1] == "InspectWorker" for name in transforms) else \
            "llm_inference"
        parameters = request.launch_parameters
        return dataflow_v1beta3.LaunchTemplateResponse(job=self._start(
            parameters.job_name, request.location, request.gcs_path, request.project_id,
            dict(parameters.environment.additional_user_labels), program=program,
            streaming=staged.get("type") == "JOB_TYPE_STREAMING", update=parameters.update))

    def _start(self, name: str, location: str, gcs_path: str, project_id: str, labels: dict, program: str,
               streaming: bool, update: bool):
        if update:  # an update replaces the running job of that name, which ends JOB_STATE_UPDATED
            running = [job for job in self.jobs.values() if job.name == name and job.location == location
                       and job.stopped_state is None and not job.stopping and not self._ended(job)]
            if not running:
                raise FailedPrecondition(f"(fake) update of job {name} in {location}: no running job has that name")
            running[0].stopped_state = JobState.JOB_STATE_UPDATED
            if self.workers:
                self.workers.stop(running[0])
        default = STREAMING_STARTS if streaming else BATCH_SUCCEEDS
        job = FakeJob(id=f"2026-11-29_00_00_00-{next(self._ids)}", name=name, location=location,
                      gcs_path=gcs_path, script=self.scripts.pop(0) if self.scripts else default, labels=labels,
                      program=program, streaming=streaming)
        self.jobs[job.id] = job
        if self.workers and job.script in (STREAMING_STARTS, BATCH_SUCCEEDS):
            self.workers.start(job)
        return dataflow_v1beta3.Job(id=job.id, name=name, project_id=project_id, location=location,
                                    current_state=JobState.JOB_STATE_PENDING)

    @staticmethod
    def _ended(job: FakeJob) -> bool:
        return job.step >= 0 and job.script[job.step][0] in TERMINAL_STATES

    def scripted_job(self, script, name: str = "gf-0123456789-llm-inference-us-central1-l4",
                     location: str = "us-central1", labels: dict | None = None, streaming: bool = True):
        """A job already launched (with ``labels``; a streaming one unless said), whose get_job answers follow
        ``script``; its handle, as launch would push it."""
        from gpuflow.platform import JobHandle

        job = FakeJob(id=f"job-{len(self.jobs) + 1}", name=name, location=location, gcs_path="gs://b/t.json",
                      script=script, labels=labels or {}, streaming=streaming)
        self.jobs[job.id] = job
        return JobHandle(kind="dataflow", id=job.id, name=name, location=location)

    # FlexTemplatesServiceClient
    def launch_flex_template(self, request):
        assert isinstance(request, dataflow_v1beta3.LaunchFlexTemplateRequest)
        self.requests.append(("launch_flex_template", request))
        parameter = request.launch_parameter
        # The launcher runs the image's gpuflow job with these parameters; llm_inference streams when it is given a
        # subscription to read.
        program = parameter.parameters.get("gpuflow_job", "")
        assert program in ("llm_inference", "gpu_check"), f"flex_main.py runs no gpuflow job named {program!r}"
        return dataflow_v1beta3.LaunchFlexTemplateResponse(job=self._start(
            parameter.job_name, request.location, parameter.container_spec_gcs_path, request.project_id,
            dict(parameter.environment.additional_user_labels), program=program,
            streaming=program == "llm_inference" and "messages_subscription" in parameter.parameters,
            update=parameter.update))

    # JobsV1Beta3Client
    def get_job(self, request):
        assert isinstance(request, dataflow_v1beta3.GetJobRequest)
        self.requests.append(("get_job", request))
        job = self.jobs.get(request.job_id)
        if job is None:
            raise NotFound(f"(bb5c) Job {request.job_id} not found")
        kind = dataflow_v1beta3.JobType.JOB_TYPE_STREAMING if job.streaming else dataflow_v1beta3.JobType.JOB_TYPE_BATCH
        # Labels come only with the views that carry them (JobView: DESCRIPTION "steps, labels and environment", ALL).
        described = request.view in (dataflow_v1beta3.JobView.JOB_VIEW_DESCRIPTION, dataflow_v1beta3.JobView.JOB_VIEW_ALL)
        return dataflow_v1beta3.Job(id=job.id, name=job.name, location=job.location, current_state=job.advance(),
                                    type_=kind, labels=job.labels if described else {})

    def update_job(self, request):
        assert isinstance(request, dataflow_v1beta3.UpdateJobRequest)
        self.requests.append(("update_job", request))
        job = self.jobs.get(request.job_id)
        if job is None:
            raise NotFound(f"(bb5c) Job {request.job_id} not found")
        requested = JobState(request.job.requested_state)
        assert requested in (JobState.JOB_STATE_CANCELLED, JobState.JOB_STATE_DRAINED)
        if requested == JobState.JOB_STATE_DRAINED and not job.streaming:
            raise FailedPrecondition(f"(fake) job {job.id} is a batch job; only streaming jobs drain")
        # A stop passes through its transitional state (the workers finish or drop their work) before it ends.
        passing = JobState.JOB_STATE_DRAINING if requested == JobState.JOB_STATE_DRAINED else \
            JobState.JOB_STATE_CANCELLING
        job.stopping = [passing, requested]
        if self.workers:
            self.workers.stop(job)
        return dataflow_v1beta3.Job(id=job.id, name=job.name, current_state=passing)

    def list_jobs(self, request):
        assert isinstance(request, dataflow_v1beta3.ListJobsRequest)
        assert request.filter == dataflow_v1beta3.ListJobsRequest.Filter.ACTIVE
        self.requests.append(("list_jobs", request))
        return [dataflow_v1beta3.Job(id=j.id, name=j.name, location=j.location)
                for j in self.jobs.values()
                if j.location == request.location and j.stopped_state not in TERMINAL_STATES and not self._ended(j)]

    # MessagesV1Beta3Client
    def list_job_messages(self, request):
        assert isinstance(request, dataflow_v1beta3.ListJobMessagesRequest)
        self.requests.append(("list_job_messages", request))
        job = self.jobs[request.job_id]
        kept = IMPORTANCE_ORDER[IMPORTANCE_ORDER.index(Importance(request.minimum_importance)):]
        response = dataflow_v1beta3.ListJobMessagesResponse(
            job_messages=[m for m in job.messages if Importance(m.message_importance) in kept],
            autoscaling_events=list(job.autoscaling_events))
        return pagers.ListJobMessagesPager(method=self._no_next_page, request=request, response=response)

    @staticmethod
    def _no_next_page(request, **kwargs):
        raise AssertionError("one page only: the response has no next_page_token")

    def calls(self, method: str) -> list[Any]:
        return [request for name, request in self.requests if name == method]


class FakeDataflowRest:
    """Dataflow's REST API as the provider's DataflowHook reaches it (the discovery client its get_conn() builds).

    Each call becomes the GAPIC request of the same method through the API's own JSON mapping (a field the API does
    not have fails the test), FakeDataflow answers it, and the answer goes back as the REST JSON the hook reads."""

    def __init__(self, dataflow: FakeDataflow):
        self.dataflow = dataflow
        self._resource = ""

    @staticmethod
    def _check(resource: str, method: str, arguments: dict) -> None:
        """The call's method and parameters must be in Dataflow's own discovery document (googleapiclient's copy)."""
        import googleapiclient

        document = json.loads((Path(googleapiclient.__file__).parent / "discovery_cache" / "documents"
                               / "dataflow.v1b3.json").read_text())
        spec = document["resources"]["projects"]["resources"]["locations"]["resources"][resource]["methods"][method]
        unknown = set(arguments) - set(spec.get("parameters", {})) - {"body"}
        assert not unknown, f"projects.locations.{resource}.{method} has no parameters {unknown}"
        assert set(spec.get("parameterOrder", [])) <= set(arguments), (method, spec["parameterOrder"], arguments)

    def _at(self, resource: str) -> FakeDataflowRest:
        at = FakeDataflowRest(self.dataflow)
        at._resource = resource
        return at

    def projects(self):
        return self

    def locations(self):
        return self

    def templates(self):
        return self._at("templates")

    def flexTemplates(self):  # noqa: N802 - the discovery client's name
        return self._at("flexTemplates")

    def jobs(self):
        return self._at("jobs")

    @staticmethod
    def _json(message) -> dict:
        return type(message).to_dict(message, preserving_proto_field_name=False, use_integers_for_enums=False)

    def _call(self, answer):
        def execute(num_retries=0):
            from googleapiclient.errors import HttpError
            from httplib2 import Response

            try:
                return answer()
            except GoogleAPICallError as refused:  # the REST client sees the same refusal as an HTTP status
                raise HttpError(Response({"status": refused.code}), str(refused).encode()) from None

        return SimpleNamespace(execute=execute)

    def launch(self, projectId, location, body, gcsPath=None):  # noqa: N803 - the REST parameters' names
        self._check(self._resource, "launch", {"projectId": projectId, "location": location, "body": body,
                                               **({"gcsPath": gcsPath} if gcsPath else {})})
        if self._resource == "templates":
            request = dataflow_v1beta3.LaunchTemplateRequest(
                project_id=projectId, location=location, gcs_path=gcsPath,
                launch_parameters=dataflow_v1beta3.LaunchTemplateParameters.from_json(json.dumps(body)))
            return self._call(lambda: {"job": self._json(self.dataflow.launch_template(request).job)})
        assert self._resource == "flexTemplates"
        request = dataflow_v1beta3.LaunchFlexTemplateRequest.from_json(
            json.dumps({"projectId": projectId, "location": location, **body}))
        return self._call(lambda: {"job": self._json(self.dataflow.launch_flex_template(request).job)})

    def get(self, projectId, location, jobId, view=None):  # noqa: N803
        self._check(self._resource, "get", {"projectId": projectId, "location": location, "jobId": jobId})
        request = dataflow_v1beta3.GetJobRequest(project_id=projectId, location=location, job_id=jobId,
                                                 view=dataflow_v1beta3.JobView[view] if view else 0)
        return self._call(lambda: self._json(self.dataflow.get_job(request)))

    def update(self, projectId, location, jobId, body):  # noqa: N803
        self._check(self._resource, "update", {"projectId": projectId, "location": location, "jobId": jobId,
                                               "body": body})
        request = dataflow_v1beta3.UpdateJobRequest(project_id=projectId, location=location, job_id=jobId,
                                                    job=dataflow_v1beta3.Job.from_json(json.dumps(body)))
        return self._call(lambda: self._json(self.dataflow.update_job(request)))


class FakeWorkers:
    """What Dataflow's workers would do, done on this machine.

    Which program runs, and whether it streams, is what the launch request said (``FakeJob.program`` and
    ``streaming``). A streaming job runs the real pipeline on BundleBasedDirectRunner against the Pub/Sub emulator
    (the argv gpuflow gives llm_inference.py, rebuilt from the job name's run prefix); a batch job runs to its end on
    the GCS emulator. The GPU check writes the report an L4 worker writes, or, with ``real_gpu_check``, runs
    gpu_check.py here (this machine has no GPU).
    """

    def __init__(self, config, env: dict[str, str], log_dir: Path, real_gpu_check: bool = False):
        self.config, self.env, self.log_dir, self.real_gpu_check = config, env, log_dir, real_gpu_check

    def _names(self, job: FakeJob):
        from gpuflow.naming import resource_names

        return resource_names(self.config, job.name.split("-")[0] + "-" + job.name.split("-")[1])

    def start(self, job: FakeJob) -> None:
        from gpuflow.steps.launch import pipeline_argv

        names = self._names(job)
        if job.program == "gpu_check":
            report_uri = names.gcs_uri("gpu-check", "report.json")
            if self.real_gpu_check:
                subprocess.run([sys.executable, str(ROOT / "beam_jobs" / "gpu_check.py"), "--report", report_uri,
                                "--runner=BundleBasedDirectRunner"], env=self.env, check=True, capture_output=True)
            else:
                write_gcs(self.env, report_uri, json.dumps(L4_WORKER_REPORT))
            return
        if not job.streaming:  # the batch job runs to its end (self.config: its dates filled in)
            subprocess.run([sys.executable, str(ROOT / "beam_jobs" / "llm_inference.py"),
                            *pipeline_argv(self.config, names, batch=True), "--runner=BundleBasedDirectRunner",
                            f"--project={self.config.project}"], env=self.env, check=True, capture_output=True)
            return
        log_file = open(self.log_dir / f"{job.id}.log", "wb")  # noqa: SIM115 - lives with the process
        job.process = subprocess.Popen(
            [sys.executable, str(ROOT / "beam_jobs" / "llm_inference.py"), *pipeline_argv(self.config, names),
             "--runner=BundleBasedDirectRunner", "--streaming", f"--project={self.config.project}"],
            env=self.env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self, job: FakeJob) -> None:
        from gpuflow.emulators import stop_process_group

        if job.process is not None:
            stop_process_group(job.process.pid)
            job.process.wait(timeout=30)


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


class FakeVertex:
    """Vertex AI's JobService. A created CustomJob runs: its script is read back from the GCS emulator and run
    here with /gcs/ paths mapped to gs:// (the demo model stands in for a hub download)."""

    def __init__(self, env: dict[str, str] | None = None, demo_model_dir: Path | None = None, fail_with: str = "",
                 running_polls: int = 1):
        self.env, self.demo_model_dir, self.fail_with = env, demo_model_dir, fail_with
        self.running_polls = running_polls  # polls that answer RUNNING before the job ends
        self.requests: list[tuple[str, Any]] = []
        self.polls = 0

    def create_custom_job(self, request):
        assert isinstance(request, aiplatform_v1.CreateCustomJobRequest)
        self.requests.append(("create_custom_job", request))
        if self.env is not None and not self.fail_with:
            self._run(request.custom_job)
        job = aiplatform_v1.CustomJob(request.custom_job)
        job.name = f"{request.parent}/customJobs/4411"
        job.state = aiplatform_v1.JobState.JOB_STATE_PENDING
        return job

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
        if self.polls <= self.running_polls:
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


class FakeCloudBuild:
    """Cloud Build: QUEUED, WORKING, then SUCCESS (the tag then exists in the fake registry) or FAILURE."""

    def __init__(self, registry: FakeArtifactRegistry, fail_with: str = ""):
        self.registry, self.fail_with = registry, fail_with
        self.requests: list[tuple[str, Any]] = []
        self.statuses: list[Any] = []

    def create_build(self, request):
        assert isinstance(request, cloudbuild_v1.CreateBuildRequest)
        self.requests.append(("create_build", request))
        status = cloudbuild_v1.Build.Status
        self.statuses = [status.QUEUED, status.WORKING, status.FAILURE if self.fail_with else status.SUCCESS]
        return SimpleNamespace(metadata=cloudbuild_v1.BuildOperationMetadata(
            build=cloudbuild_v1.Build(id="b7e1c0de", status=status.QUEUED)))

    def get_build(self, request):
        assert isinstance(request, cloudbuild_v1.GetBuildRequest)
        self.requests.append(("get_build", request))
        state = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
        if state == cloudbuild_v1.Build.Status.SUCCESS:
            (create,) = [r for n, r in self.requests if n == "create_build"][-1:]
            self.registry.tags.update(create.build.images)
        return cloudbuild_v1.Build(id=request.id, status=state, status_detail=self.fail_with,
                                   log_url="https://console.cloud.google.com/cloud-build/builds/b7e1c0de")

    def cancel_build(self, request):
        assert isinstance(request, cloudbuild_v1.CancelBuildRequest)
        self.requests.append(("cancel_build", request))


class FakeArtifactRegistry:
    def __init__(self):
        self.tags: set[str] = set()  # image URIs with their tag
        self.requests: list[Any] = []

    def get_tag(self, request):
        assert isinstance(request, artifactregistry_v1.GetTagRequest)
        self.requests.append(request)
        parts = request.name.split("/")  # projects/P/locations/L/repositories/R/packages/PKG/tags/T
        image = f"{parts[3]}-docker.pkg.dev/{parts[1]}/{parts[5]}/{parts[7].replace('%2F', '/')}:{parts[9]}"
        if image not in self.tags:
            raise NotFound(f"Requested entity was not found: {request.name}")
        return artifactregistry_v1.Tag(name=request.name)


class FakeRegionsClient:
    """Answers RegionsClient.get like the Compute API does; records each request."""

    def __init__(self, quotas_by_region):
        self.quotas_by_region = quotas_by_region
        self.requests = []

    def get(self, request):
        assert isinstance(request, compute_v1.GetRegionRequest)
        self.requests.append(request)
        quotas = [compute_v1.Quota(metric=m, limit=lim, usage=use) for m, lim, use in self.quotas_by_region[request.region]]
        return compute_v1.Region(name=request.region, quotas=quotas)


class FakeProjectsClient:
    """Answers ProjectsClient.get with the project's quotas, GPUS_ALL_REGIONS among them; records each request."""

    def __init__(self, quotas=(("GPUS_ALL_REGIONS", 16, 0), ("CPUS_ALL_REGIONS", 96, 0))):
        self.quotas = quotas
        self.requests = []

    def get(self, request):
        assert isinstance(request, compute_v1.GetProjectRequest)
        self.requests.append(request)
        return compute_v1.Project(name=request.project, quotas=[
            compute_v1.Quota(metric=metric, limit=limit, usage=usage) for metric, limit, usage in self.quotas])


class FakeCloudQuotas:
    """Cloud Quotas' GetQuotaInfo for GPUS-PER-GPU-FAMILY-per-project-region: ``limits`` maps (region, gpu_family)
    to a limit, answered as dimensions infos from the most specific to the least (a default for every region and
    family last); records each request."""

    def __init__(self, limits=None, default: int = 0):
        self.limits = limits or {}
        self.default = default
        self.requests = []

    def get_quota_info(self, request):
        from google.cloud import cloudquotas_v1

        assert isinstance(request, cloudquotas_v1.GetQuotaInfoRequest)
        self.requests.append(request)
        infos = [cloudquotas_v1.DimensionsInfo(dimensions={"region": region, "gpu_family": family},
                                               details=cloudquotas_v1.QuotaDetails(value=limit),
                                               applicable_locations=[region])
                 for (region, family), limit in self.limits.items()]
        infos.append(cloudquotas_v1.DimensionsInfo(details=cloudquotas_v1.QuotaDetails(value=self.default),
                                                   applicable_locations=["us-central1", "us-east4", "europe-west4"]))
        return cloudquotas_v1.QuotaInfo(name=request.name, quota_id=request.name.rsplit("/", 1)[-1],
                                        service="compute.googleapis.com", dimensions=["region", "gpu_family"],
                                        dimensions_infos=infos)


class FakeAcceleratorTypesClient:
    """Answers AcceleratorTypesClient.aggregated_list like Compute Engine: the real pager over one page of zone
    scopes, filtered by the request's name filter; records each request."""

    def __init__(self, offers=None):
        self.offers = offers or {"us-central1-a": ["nvidia-l4", "nvidia-tesla-t4"], "us-central1-b": ["nvidia-l4"],
                                 "us-east4-c": ["nvidia-l4"], "europe-west4-a": ["nvidia-tesla-t4"]}
        self.requests = []

    def aggregated_list(self, request):
        from google.cloud.compute_v1.services.accelerator_types import pagers

        assert isinstance(request, compute_v1.AggregatedListAcceleratorTypesRequest)
        self.requests.append(request)
        wanted = request.filter.split('"')[1] if '"' in request.filter else None
        items = {f"zones/{zone}": compute_v1.AcceleratorTypesScopedList(accelerator_types=[
            compute_v1.AcceleratorType(name=name, zone=zone) for name in names if wanted in (None, name)])
            for zone, names in self.offers.items()}
        return pagers.AggregatedListPager(method=self._no_next_page, request=request,
                                          response=compute_v1.AcceleratorTypeAggregatedList(items=items))

    @staticmethod
    def _no_next_page(request, **kwargs):
        raise AssertionError("one page only: the response has no next_page_token")


class FakeMonitoring:
    """Cloud Monitoring's MetricService: ListTimeSeries answers a GPU metric's points for the asked job.

    ``utilization`` and ``memory`` are the values of every point, in percent (INT64, as the metrics list gives
    them); ``empty_polls`` answers that many polls with no series first, as Monitoring does while metrics lag.
    Series are keyed as Dataflow writes them: resource ``dataflow_job``, the job id as the metric label."""

    def __init__(self, utilization: int = 63, memory: int = 41, empty_polls: int = 1, points: int = 4):
        self.utilization, self.memory, self.empty_polls, self.points = utilization, memory, empty_polls, points
        self.requests: list[Any] = []

    def list_time_series(self, request):
        assert isinstance(request, monitoring_v3.ListTimeSeriesRequest)
        assert request.view == monitoring_v3.ListTimeSeriesRequest.TimeSeriesView.FULL
        self.requests.append(request)
        if self.empty_polls > 0:
            self.empty_polls -= 1 if "memory" in request.filter else 0
            return []
        metric_type = request.filter.split('"')[1]
        if metric_type not in ("dataflow.googleapis.com/job/gpu_utilization",
                               "dataflow.googleapis.com/job/gpu_memory_utilization"):
            return []  # Monitoring answers an unknown metric type with no series
        if 'resource.type = "dataflow_job"' not in request.filter or "metric.labels.job_id = " not in request.filter:
            return []  # the series carry the job id as a metric label on dataflow_job only
        value = self.memory if "memory" in metric_type else self.utilization
        job_id = request.filter.rsplit('metric.labels.job_id = "', 1)[1].rstrip('"')
        start = request.interval.start_time
        return [monitoring_v3.TimeSeries(
            metric={"type": metric_type, "labels": {"job_id": job_id}},
            resource={"type": "dataflow_job", "labels": {"project_id": "p", "job_name": "j", "region": "us-central1"}},
            points=[monitoring_v3.Point(interval={"end_time": {"seconds": int(start.timestamp()) + 60 * i}},
                                        value={"int64_value": value}) for i in range(self.points)],
        )]


#: The requests each fake answers, by method: what the real GAPIC client turns a dict request into.
DATAFLOW_REQUESTS = {"get_job": dataflow_v1beta3.GetJobRequest, "update_job": dataflow_v1beta3.UpdateJobRequest,
                     "list_jobs": dataflow_v1beta3.ListJobsRequest,
                     "list_job_messages": dataflow_v1beta3.ListJobMessagesRequest}
VERTEX_REQUESTS = {"create_custom_job": aiplatform_v1.CreateCustomJobRequest,
                   "get_custom_job": aiplatform_v1.GetCustomJobRequest,
                   "cancel_custom_job": aiplatform_v1.CancelCustomJobRequest}
CLOUD_BUILD_REQUESTS = {"create_build": cloudbuild_v1.CreateBuildRequest, "get_build": cloudbuild_v1.GetBuildRequest,
                        "cancel_build": cloudbuild_v1.CancelBuildRequest}


class TypedClient:
    """A fake in place of the GAPIC client a provider hook makes, so that the hook's own code runs.

    A dict request becomes the API's request type, as the real client does; anything else (a wrong type)
    reaches the fake, which refuses it. Unknown attributes (path helpers such as ``custom_job_path``) come from
    the real client class, and a method the fake does not answer fails the test."""

    def __init__(self, fake: Any, requests: dict[str, type], real_class: type):
        missing = [method for method in requests if not callable(getattr(real_class, method, None))]
        assert not missing, f"{real_class.__name__} has no {missing}"  # answer only what the real client has
        self._fake, self._requests, self._real_class = fake, requests, real_class

    def _typed(self, method: str, request: Any) -> Any:
        request_type = self._requests[method]
        return request_type(request) if isinstance(request, dict) else request

    def __getattr__(self, name: str) -> Any:
        if name not in self._requests:
            return getattr(self._real_class, name)

        def call(request=None, **_options):
            return getattr(self._fake, name)(self._typed(name, request))

        return call


class AsyncTypedClient(TypedClient):
    """The async twin of TypedClient, for the provider's async hooks in triggers (pagers become async pagers)."""

    def __getattr__(self, name: str) -> Any:
        if name not in self._requests:
            return getattr(self._real_class, name)

        async def call(request=None, **_options):
            answer = getattr(self._fake, name)(self._typed(name, request))
            if isinstance(answer, pagers.ListJobMessagesPager):
                async def no_next_page(request, **kwargs):
                    raise AssertionError("one page only: the response has no next_page_token")

                return pagers.ListJobMessagesAsyncPager(method=no_next_page, request=answer._request,
                                                        response=answer._response)
            if isinstance(answer, list):  # a one-page listing, iterated as the async pager is
                return _AsyncItems(answer)
            return answer

        return call


class _AsyncItems:
    def __init__(self, items: list):
        self.items = items

    async def __aiter__(self):
        for item in self.items:
            yield item


class FakeGoogleCloud:
    """Google Cloud's control planes, installed at the client boundary.

    It stands in for gpuflow.platform.gcp_clients.GcpClients (the clients gpuflow makes itself), and sits under
    the provider's hooks that gpuflow calls (CustomJobHook, CloudBuildHook, DataflowHook, AsyncDataflowHook,
    CustomJobAsyncHook, CloudBuildAsyncHook), in place of the clients they make, so the hooks' and triggers' own
    code runs."""

    def __init__(self, dataflow=None, vertex=None, build=None, registry=None, regions=None, monitoring=None,
                 projects=None, accelerator_types=None, cloud_quotas=None):
        self.registry = registry or FakeArtifactRegistry()
        self.metrics = monitoring or FakeMonitoring()
        self.dataflow = dataflow or FakeDataflow()
        self.vertex = vertex or FakeVertex()
        self.build = build or FakeCloudBuild(self.registry)
        self.projects = projects or FakeProjectsClient()
        self.accelerator_types = accelerator_types or FakeAcceleratorTypesClient()
        self.cloud_quotas = cloud_quotas or FakeCloudQuotas()
        self.chain: list[str] = []  # the connection's impersonation_chain
        self.regions = regions or FakeRegionsClient({"us-central1": [("NVIDIA_L4_GPUS", 8, 0)],
                                                     "us-east4": [("NVIDIA_L4_GPUS", 8, 0)]})

    def install(self, monkeypatch) -> FakeGoogleCloud:
        from airflow.providers.google.cloud.hooks import cloud_build
        from airflow.providers.google.cloud.hooks.dataflow import AsyncDataflowHook, DataflowHook
        from airflow.providers.google.cloud.hooks.vertex_ai.custom_job import CustomJobAsyncHook, CustomJobHook
        from google.cloud.aiplatform_v1 import JobServiceAsyncClient, JobServiceClient

        cloud = self
        monkeypatch.setattr("gpuflow.platform.gcp_service.GcpClients", lambda conn_id: self)
        monkeypatch.setattr(CustomJobHook, "get_job_service_client",
                            lambda hook, region=None: TypedClient(cloud.vertex, VERTEX_REQUESTS, JobServiceClient))

        async def vertex_async(hook, region=None):
            return AsyncTypedClient(cloud.vertex, VERTEX_REQUESTS, JobServiceAsyncClient)

        async def dataflow_async(hook, client_class):  # each Dataflow client answers its own methods only
            return AsyncTypedClient(cloud.dataflow, {method: request for method, request in DATAFLOW_REQUESTS.items()
                                                     if hasattr(client_class, method)}, client_class)

        monkeypatch.setattr(CustomJobAsyncHook, "get_job_service_client", vertex_async)
        monkeypatch.setattr(DataflowHook, "get_conn", lambda hook: FakeDataflowRest(cloud.dataflow))
        monkeypatch.setattr(AsyncDataflowHook, "initialize_client", dataflow_async)
        monkeypatch.setattr(cloud_build.CloudBuildHook, "get_conn", lambda hook, location="global": TypedClient(
            cloud.build, CLOUD_BUILD_REQUESTS, cloudbuild_v1.CloudBuildClient))
        monkeypatch.setattr(cloud_build, "CloudBuildAsyncClient", lambda **kwargs: AsyncTypedClient(
            cloud.build, CLOUD_BUILD_REQUESTS, cloudbuild_v1.CloudBuildAsyncClient))
        return self

    def credentials_for_subprocess(self):
        import contextlib

        return contextlib.nullcontext()

    def artifact_registry(self):
        return self.registry

    def compute(self):
        from gpuflow.quota import ComputeClients

        return ComputeClients(self.regions, self.projects, self.accelerator_types, self.cloud_quotas)

    def compute_accelerator_types(self):
        return self.accelerator_types

    def impersonation_chain(self):
        return list(self.chain)

    def monitoring_async(self):
        return AsyncTypedClient(self.metrics, {"list_time_series": monitoring_v3.ListTimeSeriesRequest},
                                monitoring_v3.MetricServiceAsyncClient)


#: launch.mode flex_template with its launcher image pinned (a tag shaped like the Flex Template page's; tests pull
#: nothing).
FLEX = ("launch.mode=flex_template", "container.flex_launcher_tag=20260101_RC00")


def gcp_test_config(*overrides: str):
    """configs/gcp.example.yaml in the test project, polling at once: the unit tests' gcp configuration."""
    from gpuflow.config import load_config
    from tests.helpers import GCP_TEST_PROJECT

    return load_config("configs/gcp.example.yaml", overrides=[
        f"project={GCP_TEST_PROJECT}", "dataflow.poll_interval_s=0.001", *overrides])


def gcp_test_environment(emulator_env: dict[str, str], project: str, conn_id: str) -> dict[str, str]:
    """The emulators behind the gcp profile's hooks: an anonymous connection, no metadata-server probing, and
    anonymous Application Default Credentials at once in subprocesses (tests/anonymous_adc/sitecustomize.py)."""
    connection = {"conn_type": "google_cloud_platform", "extra": {"is_anonymous": True, "project": project}}
    python_path = os.pathsep.join(filter(None, [str(ROOT / "tests" / "anonymous_adc"), os.environ.get("PYTHONPATH")]))
    return {**os.environ, **emulator_env, f"AIRFLOW_CONN_{conn_id.upper()}": json.dumps(connection),
            "NO_GCE_CHECK": "True", "GOOGLE_CLOUD_PROJECT": project, "PUBSUB_PROJECT_ID": project,
            "PYTHONPATH": python_path}
