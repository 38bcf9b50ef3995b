"""A persistent deployment's rollout on the gcp profile, step by step, with Dataflow faked at the client boundary
(its requests checked against the API's own types) and the record, pointers and topics on the emulators:
the update request, the replace-then-drain order, and the rollbacks."""

import json
import os

import pytest
from google.cloud import dataflow_v1beta3

from gpuflow.configuration.loading import load_config
from gpuflow.platform import JobHandle
from gpuflow.platform.gcp import GcpPlatform
from gpuflow.platform.records import Records
from gpuflow.runs.naming import resource_names
from gpuflow.runs.rollout import DeploymentRecord, job_options, plan_rollout
from gpuflow.steps.cleanup import request_stops
from gpuflow.steps.deployment import ensure_version_pointer, promote, roll_back, update_in_place
from tests.gcp_fakes import FLEX, STREAMING_STARTS, FakeGoogleCloud, file_patterns, read_gcs
from tests.helpers import GCP_TEST_PROJECT

BUCKET = "gpuflow-deploy-gcp-test"
OLD_IMAGE = f"us-central1-docker.pkg.dev/{GCP_TEST_PROJECT}/gpuflow/l4:0000000000000001"
NEW_IMAGE = f"us-central1-docker.pkg.dev/{GCP_TEST_PROJECT}/gpuflow/l4:0000000000000002"
JobState = dataflow_v1beta3.JobState


def config_of(*overrides):
    """A persistent deployment in launch.mode direct (Beam-staged updates; a Flex Template update has its own test)."""
    return load_config("configs/gcp.example.yaml", overrides=[
        f"project={GCP_TEST_PROJECT}", f"bucket={BUCKET}", "deployment.mode=persistent", "deployment.name=chat",
        "dataflow.poll_interval_s=0.001", "launch.mode=direct", *overrides])


def running(cloud, handle: JobHandle) -> JobHandle:
    """Advance a fake job to its running state, as Dataflow would by itself."""
    while cloud.dataflow.get_job(dataflow_v1beta3.GetJobRequest(job_id=handle.id)).current_state != \
            JobState.JOB_STATE_RUNNING:
        pass
    return handle


@pytest.fixture
def deployed(gcs_bucket, monkeypatch):
    """A recorded deployment whose job runs (the fake's), and the fakes under the provider's hooks."""
    gcs_bucket(BUCKET)
    cloud = FakeGoogleCloud().install(monkeypatch)
    config = config_of()
    platform = GcpPlatform(config)
    names = resource_names(config, "gf-0000000001")
    old = running(cloud, cloud.dataflow.scripted_job(STREAMING_STARTS, name=names.job_name))
    record = DeploymentRecord(
        name="chat", job=old.to_xcom(), job_name=old.name, subscription=names.prompts_subscription, image=OLD_IMAGE,
        model_version=names.model_version, model_dir_uri=names.model_dir_uri, state_dict_uri=names.state_dict_uri,
        options=job_options(config), changed_by="manual__first")
    Records(config, platform.conn_id).write(record)
    records = Records(config, platform.conn_id)
    yield cloud, record, records
    records.delete("chat")


def test_an_updatable_change_updates_the_job_in_place_and_its_rollback_updates_it_back(deployed, monkeypatch):
    cloud, record, records = deployed
    config = config_of("inference.max_batch_size=8", "deployment.transform_name_mapping={Validate: ValidatePrompts}")
    platform = GcpPlatform(config)
    names = resource_names(config, "gf-0000000002")
    rollout = plan_rollout(config, record, NEW_IMAGE, job_running=True)
    assert rollout.path == "update", rollout.why
    assert rollout.changed == ["inference.max_batch_size", "image"]

    # As the launch task does: the job's pointer folder holds a pointer before Beam stages the update (else the
    # pipeline refuses to start, since WatchFilePattern would never fire).
    ensure_version_pointer(config, names, platform, rollout.record)
    handle = update_in_place(config, names, platform, NEW_IMAGE, rollout)

    (request,) = cloud.dataflow.calls("launch_template")
    parameters = request.launch_parameters
    assert parameters.update is True
    assert parameters.job_name == record.job_name == handle.name  # the same name: Dataflow replaces that job
    assert dict(parameters.transform_name_mapping) == {"Validate": "ValidatePrompts"}
    staged = staged_job(request)
    assert staged["name"] == record.job_name
    assert staged["environment"]["workerPools"][0]["workerHarnessContainerImage"] == NEW_IMAGE
    assert staged["labels"] == {"gpuflow-deployment": "chat", "gpuflow-run": names.prefix}
    # RunInference's automatic model refresh: WatchFilePattern on the deployment's pointer folder, as the side
    # input of the inference step, with the pattern it watches in its display data.
    pipeline = staged_pipeline(records.gcs, staged)
    transforms = {t.unique_name: t for t in pipeline.components.transforms.values()}
    assert any(name.startswith("WatchModelVersions/") for name in transforms)
    assert any(side_inputs(t) for name, t in transforms.items() if name.startswith("RunInference/"))

    # The new version fails its smoke test: the record still names the old image, and an update restores it.
    result = roll_back(config, names, platform, rollout, handle, run_id="manual__second")
    assert result == {"rolled_back": True, "serving": record.model_version}
    first, second = cloud.dataflow.calls("launch_template")
    assert second.launch_parameters.update is True and second.launch_parameters.job_name == record.job_name
    restored = staged_job(second)
    assert restored["environment"]["workerPools"][0]["workerHarnessContainerImage"] == OLD_IMAGE
    kept = records.read("chat")
    assert (kept.image, kept.model_version, kept.options) == (record.image, record.model_version, record.options)
    assert kept.job["id"] != record.job["id"]  # the restoring update's job serves now

    # Airflow retries the cleanup (say, its worker died after the rollback): the job is not updated a second time.
    again = roll_back(config, names, platform, rollout, handle, run_id="manual__second")
    assert again == result and len(cloud.dataflow.calls("launch_template")) == 2
    assert records.read("chat") == kept



def test_a_flex_template_update_sends_the_update_fields_through_the_providers_flex_launch(deployed):
    cloud, record, records = deployed
    config = config_of(*FLEX, "deployment.transform_name_mapping={Validate: ValidatePrompts}")
    platform = GcpPlatform(config)
    names = resource_names(config, "gf-0000000003")

    handle = platform.update_pipeline(["--model-name", "m"], names, NEW_IMAGE, record.job_name,
                                      config.deployment.transform_name_mapping)

    (request,) = cloud.dataflow.calls("launch_flex_template")
    parameter = request.launch_parameter
    assert parameter.update is True and parameter.job_name == record.job_name == handle.name
    assert dict(parameter.transform_name_mappings) == {"Validate": "ValidatePrompts"}
    spec = json.loads(read_gcs(dict(os.environ), parameter.container_spec_gcs_path))  # the template file, written
    assert spec["image"] == NEW_IMAGE


def test_an_update_of_a_job_that_does_not_run_fails_as_dataflow_fails_it(deployed):
    from googleapiclient.errors import HttpError

    cloud, record, _ = deployed
    config = config_of(*FLEX)  # the provider's flex launch goes through Dataflow's REST API: a 400 there
    with pytest.raises(HttpError, match="no running job") as refused:
        GcpPlatform(config).update_pipeline(["--model-name", "m"], resource_names(config, "gf-0000000004"), NEW_IMAGE,
                                            "gfd-nobody-llm-inference", {})
    assert refused.value.resp.status == 400
    assert cloud.dataflow.jobs[record.job["id"]].stopped_state is None  # the deployment's job is untouched


def staged_pipeline(gcs, staged: dict):
    """The pipeline proto Beam staged with the job request."""
    from apache_beam.portability.api import beam_runner_api_pb2

    bucket, _, blob = staged["environment"]["sdkPipelineOptions"]["options"]["pipelineUrl"].removeprefix(
        "gs://").partition("/")
    return beam_runner_api_pb2.Pipeline.FromString(gcs.download(bucket, blob))


def side_inputs(transform) -> list[str]:
    """The side inputs of a ParDo in the pipeline proto."""
    from apache_beam.portability.api import beam_runner_api_pb2

    if transform.spec.urn != "beam:transform:pardo:v1":
        return []
    return list(beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload).side_inputs)


def staged_job(request) -> dict:
    """The job request Beam staged at the launch request's template path."""
    return json.loads(read_gcs(dict(os.environ), request.gcs_path))


def replacing(cloud, record, prefix: str):
    """A run whose changed worker disk replaces the recorded job: its config, platform, names and plan."""
    config = config_of("worker.disk_size_gb=100")
    names = resource_names(config, prefix)
    return config, GcpPlatform(config), names, plan_rollout(config, record, OLD_IMAGE, job_running=True)


def test_a_replacement_starts_first_and_the_old_job_is_drained_only_after_promotion(deployed):
    cloud, record, records = deployed
    config, platform, names, rollout = replacing(cloud, record, "gf-0000000003")
    assert rollout.path == "replace" and "worker.disk_size_gb" in rollout.why
    new = cloud.dataflow.scripted_job(STREAMING_STARTS, name=names.job_name)  # launch's new job, on the same
    assert names.prompts_subscription == record.subscription                  # subscription

    draining = promote(config, names, platform, rollout, new, OLD_IMAGE, run_id="manual__third")

    assert draining.id == record.job["id"]
    (stop,) = cloud.dataflow.calls("update_job")
    assert stop.job_id == record.job["id"] and JobState(stop.job.requested_state) == JobState.JOB_STATE_DRAINED
    promoted = records.read("chat")
    assert promoted.job["id"] == new.id and promoted.model_version == names.model_version
    assert promoted.options["worker.disk_size_gb"] == 100
    # cleanup then stops nothing that serves: the new job is the record's.
    assert request_stops(names, platform, new, keep=promoted.job["id"]) == []
    assert [r.job_id for r in cloud.dataflow.calls("update_job")] == [record.job["id"]]


def test_a_replacement_that_fails_its_smoke_test_is_cancelled_and_the_old_job_keeps_serving(deployed):
    cloud, record, records = deployed
    config, platform, names, rollout = replacing(cloud, record, "gf-0000000004")
    new = running(cloud, cloud.dataflow.scripted_job(STREAMING_STARTS, name=names.job_name))

    result = roll_back(config, names, platform, rollout, new, run_id="manual__fourth")
    serving = records.read("chat")
    stopping = request_stops(names, platform, new, keep=serving.job["id"])

    assert result["rolled_back"] is True and serving == record
    assert [h.id for h in stopping] == [new.id]
    (stop,) = cloud.dataflow.calls("update_job")
    assert stop.job_id == new.id and JobState(stop.job.requested_state) == JobState.JOB_STATE_CANCELLED
    assert cloud.dataflow.jobs[record.job["id"]].stopped_state is None  # untouched


def test_weights_that_fail_point_the_job_back_at_the_recorded_version(deployed):
    cloud, record, records = deployed
    config = config_of()
    platform = GcpPlatform(config)
    names = resource_names(config, "gf-0000000005")
    rollout = plan_rollout(config, record, OLD_IMAGE, job_running=True)
    assert rollout.path == "weights"
    from gpuflow.steps.deployment import roll_out_weights

    handle = roll_out_weights(config, names, platform, rollout)
    roll_back(config, names, platform, rollout, handle, run_id="manual__fifth")

    folder = "gpuflow/deployments/chat/live/"
    pointers = sorted(records.gcs.list(BUCKET, prefix=folder))
    versions = [json.loads(records.gcs.download(BUCKET, name))["version"] for name in pointers]
    # The newest points back (pointer names sort by when they were written; another test's may lie before them).
    assert versions[-2:] == [names.model_version, record.model_version]
    assert records.read("chat") == record
    assert cloud.dataflow.calls("update_job") == [] and handle.id == record.job["id"]


def test_a_deployments_job_never_starts_on_an_empty_pointer_folder(deployed):
    """Beam's WatchFilePattern needs a pointer before the job starts: a new deployment gets its launch version's,
    a serving deployment whose folder has none gets the recorded version's (never the new one, which would switch
    the serving job before the smoke test), and a folder with pointers is left as it is."""
    cloud, record, records = deployed
    config = config_of("deployment.name=fresh")
    platform = GcpPlatform(config)
    folder = "gpuflow/deployments/fresh/live/"

    def versions():
        return [json.loads(records.gcs.download(BUCKET, name))["version"]
                for name in sorted(records.gcs.list(BUCKET, prefix=folder))]

    try:
        first = resource_names(config, "gf-0000000011")
        assert ensure_version_pointer(config, first, platform, None) and versions() == [first.model_version]
        records.gcs.delete(BUCKET, records.gcs.list(BUCKET, prefix=folder)[0])
        later = resource_names(config, "gf-0000000012")
        serving = record.model_copy(update={"name": "fresh"})
        assert ensure_version_pointer(config, later, platform, serving) and versions() == [record.model_version]
        assert ensure_version_pointer(config, later, platform, serving) is None  # one there: nothing new
        assert versions() == [record.model_version]
    finally:
        for name in records.gcs.list(BUCKET, prefix=folder):
            records.gcs.delete(BUCKET, name)


def test_the_rollout_gate_runs_both_versions_as_batch_jobs_of_the_run_then_decides_and_records(deployed):
    """Both versions' evaluation jobs as Dataflow receives them (each on its own image, as batch jobs of the run, on
    the evaluation set, writing under the run's folder), then the gate on their answers, its page, and the record."""
    from gpuflow.runs.rollout_gate import GateDecision
    from gpuflow.steps.evaluation import evaluation_versions, gate, start_evaluation, write_report

    cloud, record, records = deployed
    eval_set = f"gs://{BUCKET}/eval/set.jsonl"
    records.gcs.upload(BUCKET, "eval/set.jsonl", data="\n".join(json.dumps(line) for line in (
        {"id": "capital", "prompt": "capital of france?", "reference": "Paris"},
        {"id": "sky", "prompt": "why is the sky blue?"})) + "\n")
    config = config_of("inference.max_batch_size=8", f"rollout.eval_set={eval_set}", "rollout.score=contains")
    names = resource_names(config, "gf-0000000009")
    rollout = plan_rollout(config, record, NEW_IMAGE, job_running=True)
    versions = evaluation_versions(config, names, rollout, NEW_IMAGE)
    assert [(v.role, v.names.model_version) for v in versions] == [("serving", record.model_version),
                                                                      ("candidate", names.model_version)]

    handles = [start_evaluation(GcpPlatform(version.config), version, config) for version in versions]

    requests = cloud.dataflow.calls("launch_template")
    assert len(requests) == 2
    for version, handle, request, image in zip(versions, handles, requests, (OLD_IMAGE, NEW_IMAGE), strict=True):
        staged = staged_job(request)
        assert staged["type"] == "JOB_TYPE_BATCH" and staged["name"] == handle.name == request.launch_parameters.job_name
        assert handle.name.startswith(f"{names.prefix}-eval-{version.role}-")  # the run's job, found by its prefix
        assert staged["labels"] == {"gpuflow-run": names.prefix}  # not the deployment's: the run's cleanup owns it
        assert staged["environment"]["workerPools"][0]["workerHarnessContainerImage"] == image
        assert staged["environment"]["serviceOptions"] == [
            "worker_accelerator=type:nvidia-l4;count:1;install-nvidia-driver"]
        folder = f"gs://{BUCKET}/gpuflow/{names.prefix}/evaluation/{version.role}"
        assert file_patterns(staged_pipeline(records.gcs, staged)) == {
            "ReadPrompts": eval_set, "WriteAnswers": f"{folder}/responses.jsonl",
            "WriteDeadLetters": f"{folder}/dead_letters.jsonl", "WriteSummary": f"{folder}/summary.json"}
        # Each version with the candidate's batches, fixed at its largest
        assert (version.config.inference.min_batch_size, version.config.inference.max_batch_size) == (8, 8)

        # The set cut into keyed batches of the candidate's size (llm_inference.py --eval-rounds), the same in both
        transforms = staged_pipeline(records.gcs, staged).components.transforms.values()
        assert {"AllPrompts", "FixedBatches"} <= {transform.unique_name for transform in transforms}

    # The jobs' answers, as llm_inference.py --eval-rounds writes them (the set's 2 prompts in one batch, 9 rounds):
    # the candidate misses the reference and is slower.
    def answered(role: str, capital: str, latency_s: float) -> None:
        lines = [{"id": prompt_id, "response": response, "latency_s": latency_s, "batch_size": 2,
                  "response_tokens": 4, "batch": f"r{number}b0", "round": number, "batch_index": 0}
                 for number in range(9) for prompt_id, response in (("capital", capital),
                                                                    ("sky", "Rayleigh scattering"))]
        records.gcs.upload(BUCKET, f"gpuflow/{names.prefix}/evaluation/{role}/responses.jsonl",
                           data="".join(json.dumps(line) + "\n" for line in lines))

    answered("serving", "It is Paris.", 0.2)
    answered("candidate", "Lyon", 0.5)
    decision = gate(config, "google_cloud_default", versions)
    assert decision.refused
    assert (decision.serving.mean_score, decision.candidate.mean_score) == (1.0, 0.5)
    assert "score: " in decision.why and "latency: " in decision.why and "0.5s" in decision.why
    assert decision.median_latency_ratio == 2.5 and len(decision.pairs) == 8
    page, console = write_report(config, "google_cloud_default", names, decision, "manual__gated")
    assert page == f"gs://{BUCKET}/gpuflow/deployments/chat/evaluations/{names.prefix}.md"
    # The provider's FileDetailsLink, as its link to the page would be.
    from airflow.providers.google.common.links.storage import FileDetailsLink

    assert console == FileDetailsLink.format_str.format(
        uri=f"{BUCKET}/gpuflow/deployments/chat/evaluations/{names.prefix}.md", project_id=GCP_TEST_PROJECT)
    assert b"| mean score (contains) | 1.0 | 0.5 |" in records.gcs.download(BUCKET, page.removeprefix(f"gs://{BUCKET}/"))

    # A candidate that answers as well, as fast: promoted, and the record keeps both versions' figures.
    answered("candidate", "Paris", 0.2)
    passed = gate(config, "google_cloud_default", versions)
    assert passed.decision == "promote", passed.why
    promote(config, names, GcpPlatform(config), rollout, JobHandle.model_validate(record.job), NEW_IMAGE,
            "manual__gated", evaluation=passed.model_dump(mode="json"))
    kept = GateDecision.model_validate(records.read("chat").evaluation)
    assert kept == passed and kept.serving.version == record.model_version


def test_on_dataflow_the_evaluate_task_starts_both_jobs_before_it_defers_and_a_kill_cancels_both(deployed,
                                                                                               monkeypatch):
    """EvaluateOperator on gcp: each evaluation job gets workers of its own and a start takes minutes, so both are
    launched before the task defers on the first; a kill before the deferral cancels both (its on_kill)."""
    from types import SimpleNamespace

    from airflow.sdk.exceptions import TaskDeferred

    from gpuflow.operators.base import ROLLOUT_KEY
    from gpuflow.operators.deployment import EvaluateOperator
    from gpuflow.triggers import settle
    from tests.helpers import RecordingTI

    monkeypatch.setattr(settle, "HOLD_S", 0.0)  # defer at once: the test reads the deferral
    cloud, record, records = deployed
    records.gcs.upload(BUCKET, "eval/set.jsonl", data=json.dumps({"id": "sky", "prompt": "why is the sky blue?"}))
    config = config_of(f"rollout.eval_set=gs://{BUCKET}/eval/set.jsonl")
    names = resource_names(config, "gf-0000000010")
    ti = RecordingTI()
    ti.xcom_push(ROLLOUT_KEY, plan_rollout(config, record, NEW_IMAGE, job_running=True).model_dump(mode="json"))
    context = {"ti": ti, "run_id": "manual__evaluated",
               "dag": SimpleNamespace(task_dict={"preflight": SimpleNamespace(workflow="inference")})}
    operator = EvaluateOperator(task_id="evaluate", config_json=config.model_dump(mode="json"), image=NEW_IMAGE)

    with pytest.raises(TaskDeferred) as deferred:
        operator.execute_step(config, names, GcpPlatform(config), context)
    launched = [request.launch_parameters.job_name for request in cloud.dataflow.calls("launch_template")]
    assert [name.split("-eval-")[1].split("-")[0] for name in launched] == ["serving", "candidate"], launched
    carried = deferred.value.trigger.carried
    assert [job["name"] for job in carried["jobs"]] == launched and carried["number"] == 0
    assert carried["handle"]["name"] == launched[0] and deferred.value.method_name == "execute_complete"

    operator.on_kill()
    cancels = cloud.dataflow.calls("update_job")
    assert sorted(request.job_id for request in cancels) == sorted(job["id"] for job in carried["jobs"])
    assert {JobState(request.job.requested_state) for request in cancels} == {JobState.JOB_STATE_CANCELLED}
