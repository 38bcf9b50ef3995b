"""Publishing a batch run's staged outputs on the GCS emulator (the provider's GCSHook), and waiting for input:
the date's folders are replaced whole, only when the counts add up; _SUCCESS comes last."""

import json

import pytest

from gpuflow.configuration.loading import load_config
from gpuflow.runs.batch_paths import staging_folders
from gpuflow.runs.batch_templates import fill_batch_paths
from gpuflow.runs.naming import resource_names
from gpuflow.steps.batch import CountsDoNotAddUp, discard_staging, find_input, publish_outputs, staged_summary
from tests.helpers import GCP_TEST_PROJECT, first_event

BUCKET = "gpuflow-publish-test"
CONN = "google_cloud_default"


@pytest.fixture
def gcs(gcs_bucket):
    return gcs_bucket(BUCKET)


def batch_config(day: str, *overrides):
    config = load_config("configs/gcp.example.yaml", overrides=[f"project={GCP_TEST_PROJECT}", f"bucket={BUCKET}",
                                                                 "model.name=google/flan-t5-large", *overrides])
    return fill_batch_paths(config, {"ds": day})


def put(gcs, uri: str, lines: list[str]):
    gcs.upload(BUCKET, uri.removeprefix(f"gs://{BUCKET}/"), data="".join(line + "\n" for line in lines))


def listing(gcs, folder: str) -> dict[str, str]:
    prefix = folder.removeprefix(f"gs://{BUCKET}/")
    return {name.removeprefix(prefix): gcs.download(BUCKET, name).decode() for name in gcs.list(BUCKET, prefix=prefix)}


def stage_a_run(gcs, config, names, answered: int, dead_lettered: int, claimed_answered: int | None = None):
    answers, dead_letters = staging_folders(config, names.prefix)
    put(gcs, answers + "responses.jsonl", [json.dumps({"id": str(i), "response": "r"}) for i in range(answered)])
    put(gcs, dead_letters + "dead_letters.jsonl", [json.dumps({"id": None, "reason": "blank_line"})] * dead_lettered)
    put(gcs, answers + "summary.json", [json.dumps({
        "lines_in": answered + dead_lettered, "answered": answered if claimed_answered is None else claimed_answered,
        "dead_lettered": dead_lettered, "response_tokens": 8 * answered,
        "dead_letter_reasons": {"blank_line": dead_lettered} if dead_lettered else {}})])


def test_a_rerun_replaces_gpuflows_files_in_the_dates_folders_and_success_comes_last(gcs, gcp_env):
    config = batch_config("2026-03-01")
    put(gcs, f"gs://{BUCKET}/prompts/2026-03-01/a.jsonl", ["1", "2"])
    put(gcs, f"gs://{BUCKET}/prompts/2026-03-01/b.jsonl", ["3"])
    put(gcs, f"gs://{BUCKET}/prompts/2026-03-01/nested/c.jsonl", ["not matched: * stays in its folder"])
    assert find_input(config, CONN) == [f"gs://{BUCKET}/prompts/2026-03-01/a.jsonl",
                                        f"gs://{BUCKET}/prompts/2026-03-01/b.jsonl"]
    # An earlier run's output (gpuflow's names), and a team's own files beside it and below it
    put(gcs, config.batch.output + "responses.jsonl", ["old"] * 5)
    put(gcs, config.batch.output + "responses-00001-of-00002.jsonl", ["old"])
    put(gcs, config.batch.output + "_SUCCESS", ["{}"])
    put(gcs, config.batch.output + "team-notes.txt", ["ours"])
    put(gcs, config.batch.output + "archive/responses.jsonl", ["ours too"])
    names = resource_names(config, "gf-pub000001")
    stage_a_run(gcs, config, names, answered=2, dead_lettered=1)

    summary = staged_summary(config, names, CONN, job_seconds=4.0)
    assert (summary["lines_in"], summary["answered"], summary["dead_lettered"], summary["input_files"]) == (3, 2, 1, 2)
    assert (summary["prompts_per_s"], summary["tokens_per_s"]) == (0.5, 4.0)
    publish_outputs(config, names, CONN, summary)

    answers = listing(gcs, config.batch.output)
    # gpuflow's files replaced; what gpuflow did not write stays (a run deletes only what it makes)
    assert sorted(answers) == ["_SUCCESS", "archive/responses.jsonl", "responses.jsonl", "team-notes.txt"]
    assert (answers["team-notes.txt"], answers["archive/responses.jsonl"]) == ("ours\n", "ours too\n")
    assert len(answers["responses.jsonl"].splitlines()) == 2 and json.loads(answers["_SUCCESS"]) == summary
    assert len(listing(gcs, config.batch.dead_letter_output)["dead_letters.jsonl"].splitlines()) == 1
    assert all(listing(gcs, folder) == {} for folder in staging_folders(config, names.prefix))


def test_counts_that_do_not_add_up_publish_nothing(gcs, gcp_env):
    config = batch_config("2026-03-02")
    put(gcs, f"gs://{BUCKET}/prompts/2026-03-02/a.jsonl", ["1", "2", "3"])
    put(gcs, config.batch.output + "responses.jsonl", ["kept"])
    names = resource_names(config, "gf-pub000002")
    stage_a_run(gcs, config, names, answered=1, dead_lettered=1, claimed_answered=2)  # a line went missing
    with pytest.raises(CountsDoNotAddUp, match=r"1 answered \+ 1 dead-lettered != 3 line\(s\) in.*Nothing was "):
        staged_summary(config, names, CONN, job_seconds=1.0)
    assert listing(gcs, config.batch.output) == {"responses.jsonl": "kept\n"}
    assert discard_staging(config, names, CONN) == 3  # cleanup takes the staged files away


def test_a_job_that_left_no_summary_publishes_nothing(gcs, gcp_env):
    config = batch_config("2026-03-03")
    with pytest.raises(CountsDoNotAddUp, match="left no summary.*did not finish"):
        staged_summary(config, resource_names(config, "gf-pub000003"), CONN, job_seconds=1.0)


@pytest.mark.parametrize("profile", ["local", "gcp"])
def test_the_input_wait_ends_when_a_file_matches_or_at_its_timeout(gcs, gcp_env, profile, local_config):
    from gpuflow.triggers.batch_input import input_trigger

    day = "2026-03-04" if profile == "local" else "2026-03-05"
    overrides = ["batch.input_wait_s=1.5", "batch.input_poll_interval_s=0.2"]
    if profile == "local":
        overrides += ["profile=local", f"local.storage_emulator_host={local_config.local.storage_emulator_host}"]
    config = batch_config(day, *overrides)
    event = first_event(input_trigger(config))
    assert event["status"] == "timeout" and "no file matched" in event["message"]
    put(gcs, f"gs://{BUCKET}/prompts/{day}/late.jsonl", ["1"])
    assert first_event(input_trigger(config))["status"] == "success"


@pytest.mark.parametrize("missing_input", ["skip", "fail"])
def test_wait_for_input_in_its_worker_skips_or_fails_at_its_timeout_and_finds_a_late_file(gcs, gcp_env,
                                                                                          missing_input):
    """The provider's sensor waiting in its worker slot (deferrable=False): batch.input_wait_s is its timeout and
    batch.missing_input its soft_fail; its poke lists the bucket with the glob."""
    from gpuflow.operators.airflow_names import AirflowSensorTimeout, AirflowSkipException
    from gpuflow.operators.batch import WaitForInputOperator

    day = "2026-03-06" if missing_input == "skip" else "2026-03-07"
    config = batch_config(day, "batch.input_wait_s=0.5", "batch.input_poll_interval_s=0.1",
                          f"batch.missing_input={missing_input}")
    sensor = WaitForInputOperator(task_id="wait_for_input", config_json=config.model_dump(mode="json"),
                                  deferrable=False)
    with pytest.raises(AirflowSkipException if missing_input == "skip" else AirflowSensorTimeout):
        sensor.execute({})
    assert (sensor.bucket, sensor.object, sensor.timeout) == (BUCKET, f"prompts/{day}/*.jsonl", 0.5)
    put(gcs, f"gs://{BUCKET}/prompts/{day}/late.jsonl", ["1"])
    assert sensor.execute({}) is True


def test_wait_for_input_defers_to_the_bounded_blob_trigger(gcs, gcp_env):
    """Deferred: the sensor's own GCSBlobTrigger arguments, bounded by batch.input_wait_s."""
    try:
        from airflow.sdk.exceptions import TaskDeferred
    except ImportError:  # Airflow 3.1, Composer's floor
        from airflow.exceptions import TaskDeferred

    from gpuflow.operators.batch import WaitForInputOperator
    from gpuflow.triggers.batch_input import BoundedGcsBlobTrigger

    config = batch_config("2026-03-08", "batch.input_wait_s=30")
    sensor = WaitForInputOperator(task_id="wait_for_input", config_json=config.model_dump(mode="json"),
                                  deferrable=True)
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute({})
    trigger = deferred.value.trigger
    assert isinstance(trigger, BoundedGcsBlobTrigger) and trigger.timeout_s == 30 and trigger.use_glob
    assert (trigger.bucket, trigger.object_name) == (BUCKET, "prompts/2026-03-08/*.jsonl")
    assert deferred.value.timeout.total_seconds() > 30  # Airflow's own deferral timeout, a backstop behind it
