"""Dataflow's Templates, Flex Templates, Jobs and Messages services, and what its workers would do here."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from google.api_core.exceptions import FailedPrecondition, GoogleAPICallError, NotFound
from google.cloud import dataflow_v1beta3
from google.cloud.dataflow_v1beta3.services.messages_v1_beta3 import pagers

from tests.gcp_fakes.gcs import read_gcs, read_staged_job, write_gcs
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
        if self.workers:  # a DAG run on the emulators: Dataflow reads the template file, which names the launcher
            spec = json.loads(read_gcs(self.workers.env, parameter.container_spec_gcs_path))
            assert spec["image"] and spec["sdkInfo"]["language"] == "PYTHON", spec
            self.staged[parameter.container_spec_gcs_path] = spec
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
        from gpuflow.runs.naming import resource_names

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
        from gpuflow.platform.emulators import stop_process_group

        if job.process is not None:
            stop_process_group(job.process.pid)
            job.process.wait(timeout=30)
