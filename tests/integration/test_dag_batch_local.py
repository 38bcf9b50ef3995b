"""llm_batch_inference on the local profile, with the real Airflow (dag.test() per logical date, as a backfill
runs them), the GCS emulator, the DirectRunner and the demo model. Answers are checked against model.generate."""

import json
import re

import pendulum
import pytest
from airflow.utils.state import DagRunState, TaskInstanceState

from gpuflow.runs.naming import resource_names, run_prefix
from gpuflow.steps.resources import list_run_resources
from tests.helpers import site_config

DAG_ID = "llm_batch_inference"
MAX_NEW_TOKENS = 8
DATES = [pendulum.datetime(2026, 3, day, tz="UTC") for day in (1, 2, 3)]


@pytest.fixture
def dag(airflow_db):
    """The test's runs: each of the DAG of its conf's site file (``tests.helpers.run_dag``)."""
    return DAG_ID


@pytest.fixture(scope="module")
def folders(local_config):
    """Under local.state_dir: the only local folders a run's conf may point batch.* at (gpuflow.runs.run_policy)."""
    import tempfile
    from pathlib import Path

    return Path(tempfile.mkdtemp(prefix="batch-", dir=local_config.local.state_dir))


MODEL_BUCKET = "gpuflow-batch-models"


@pytest.fixture(scope="module")
def kept_model(local_config, emulators):
    """export.model_dir on the GCS emulator: the first run exports there, the later runs skip the export."""
    from airflow.providers.google.cloud.hooks.gcs import GCSHook

    from gpuflow.platform.emulators import LOCAL_CONN_ID, emulator_environment

    with emulator_environment(local_config):
        hook = GCSHook(gcp_conn_id=LOCAL_CONN_ID)
        if not hook.get_conn().bucket(MODEL_BUCKET).exists():
            hook.create_bucket(bucket_name=MODEL_BUCKET, project_id=local_config.project)
    return f"gs://{MODEL_BUCKET}/demo"


def run_conf(local_config, folders, **extra):
    from tests.helpers import local_site_file, site_config

    return {
        # export.model_dir on the model bucket: a prefix the site's file allows runs to name
        "config_file": site_config("batch.yaml", local_site_file(), **{"allowed.gcs_prefixes": [f"gs://{MODEL_BUCKET}/"]}),
        "model__max_new_tokens": MAX_NEW_TOKENS,
        "batch__input": f"{folders}/prompts/{{ds}}/*.jsonl",
        "batch__output": f"{folders}/answers/{{ds}}/",
        "batch__dead_letter_output": f"{folders}/dead_letters/{{ds}}/",
        "batch__input_wait_s": 0,
        **extra,
    }


def write_input(folders, date, lines: list, name: str = "part-0.jsonl"):
    folder = folders / "prompts" / date.to_date_string()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(b"".join((line if isinstance(line, bytes) else line.encode()) + b"\n"
                                         for line in lines))


def prompts_lines(prefix: str, count: int) -> list[str]:
    return [json.dumps({"id": f"{prefix}-{i}", "prompt": f"tell me about the {prefix} river number {i}"})
            for i in range(count)]


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def published(folders, date):
    day = date.to_date_string()
    answers, dead_letters = folders / "answers" / day, folders / "dead_letters" / day
    return (read_jsonl(answers / "responses.jsonl"), read_jsonl(dead_letters / "dead_letters.jsonl"),
            json.loads((answers / "_SUCCESS").read_text()), sorted(p.name for p in answers.iterdir()))


def task_states(run):
    return {ti.task_id: ti.state for ti in run.get_task_instances()}


def run_for(dag, date, conf):
    from tests.helpers import run_dag

    return run_dag(dag, conf, logical_date=date)


def answer_events(run_id: str) -> list[dict]:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from gpuflow.operators.batch import BATCH_ANSWERS_ASSET

    with create_session() as session:
        events = session.scalars(select(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
                                 .where(AssetModel.name == BATCH_ANSWERS_ASSET.name,
                                        AssetEvent.source_run_id == run_id))
        return [dict(event.extra) for event in events]


def assert_answers_match_generate(answers, prompts_by_id, reference_generate):
    assert sorted(a["id"] for a in answers) == sorted(prompts_by_id)
    for answer in answers:
        assert answer["prompt"] == prompts_by_id[answer["id"]]
        assert re.fullmatch(r"gpuflow-demo@gf-[0-9a-f]{10}", answer["model"])  # the version: the run's export
        assert answer["response"] == reference_generate(answer["prompt"], MAX_NEW_TOKENS), answer["id"]


def no_leftovers(local_config, folders, run):
    from gpuflow.platform.emulators import LOCAL_CONN_ID, emulator_environment

    names = resource_names(local_config, run_prefix(run.dag_id, run.run_id))
    with emulator_environment(local_config):
        assert list_run_resources(local_config, names, LOCAL_CONN_ID) == {"topics": [], "subscriptions": [],
                                                                          "buckets": []}
    assert not list(folders.rglob("_gpuflow-staging-*")), "a staging folder was left behind"


MALFORMED = [
    b'{"id": "latin1", "prompt": "caf\xe9"}',  # invalid UTF-8
    b"this is not json",
    json.dumps({"id": "no-prompt"}).encode(),
    json.dumps({"prompt": "who am i"}).encode(),
    json.dumps({"id": "not-text", "prompt": 42}).encode(),
    json.dumps({"id": "empty", "prompt": "   "}).encode(),
    json.dumps({"id": "long", "prompt": " ".join(["river"] * 600)}).encode(),
    json.dumps({"id": "c-0", "prompt": "the c river again"}).encode(),  # a repeated id: the prompt sorting first stays
    json.dumps([1, 2]).encode(),
    b"",
]


def test_three_dates_backfilled_then_one_rerun_replaces_its_output_whole(dag, local_config, emulators, folders,
                                                                          reference_generate, kept_model):
    """A backfill of three dates gives three complete outputs; the third date's input has every malformed kind,
    and its counts add up. A rerun of the second date (its input changed) replaces that date's output, and
    nothing is duplicated. The model is exported once and kept (export.model_dir); the third date runs on CPU
    workers (gpu.type none: no GPU check)."""
    inputs = {DATES[0]: prompts_lines("a", 5), DATES[1]: prompts_lines("b", 4),
              DATES[2]: [*prompts_lines("c", 3), *MALFORMED]}
    for date, lines in inputs.items():
        write_input(folders, date, lines)
    runs = {}
    # CPU workers: the machine type is the site's (a run may not pick one without limits.max_usd_per_hour)
    cpu_workers = {"config_file": site_config("batch-cpu.yaml", run_conf(local_config, folders)["config_file"], **{
        "gpu.type": "none", "gpu.machine_type": "n2-highmem-2"})}
    for date in DATES:
        run = run_for(dag, date, run_conf(local_config, folders, export__model_dir=kept_model,
                                          **(cpu_workers if date == DATES[2] else {})))
        assert run.state == DagRunState.SUCCESS, task_states(run)
        assert set(task_states(run).values()) == {TaskInstanceState.SUCCESS}
        no_leftovers(local_config, folders, run)
        runs[date] = run
    export = {date: run.get_task_instance("export_model").xcom_pull(task_ids="export_model") for date, run in runs.items()}
    assert [export[date]["skipped"] for date in DATES] == [False, True, True]
    cleaned = runs[DATES[0]].get_task_instance("cleanup").xcom_pull(task_ids="cleanup")
    assert (cleaned["deleted_topics"], cleaned["deleted_subscriptions"]) == ([], [])  # a batch run makes no Pub/Sub
    gpu_check = runs[DATES[2]].get_task_instance("verify_gpu").xcom_pull(task_ids="verify_gpu")
    assert gpu_check["skipped"] == "gpu.type none: CPU workers"

    for date in DATES[:2]:
        answers, dead_letters, summary, files = published(folders, date)
        prompts = {json.loads(line)["id"]: json.loads(line)["prompt"] for line in inputs[date]}
        assert_answers_match_generate(answers, prompts, reference_generate)
        assert dead_letters == [] and files == ["_SUCCESS", "responses.jsonl"]
        assert (summary["ds"], summary["lines_in"], summary["answered"], summary["dead_lettered"]) == (
            date.to_date_string(), len(prompts), len(prompts), 0)
        assert summary["prompts_per_s"] > 0 and summary["tokens_per_s"] > 0
        assert answer_events(runs[date].run_id) == [summary]

    answers, dead_letters, summary, _ = published(folders, DATES[2])
    assert_answers_match_generate(answers, {f"c-{i}": f"tell me about the c river number {i}" for i in range(3)},
                                  reference_generate)
    assert (summary["lines_in"], summary["answered"], summary["dead_lettered"]) == (13, 3, 10)
    assert summary["dead_letter_reasons"] == {
        "blank_line": 1, "duplicate_id": 1, "empty_prompt": 1, "invalid_json": 1, "invalid_utf8": 1, "no_id": 1,
        "no_prompt": 1, "not_an_object": 1, "prompt_not_a_string": 1, "too_many_tokens": 1}
    assert sorted(letter["reason"] for letter in dead_letters) == sorted(
        reason for reason, count in summary["dead_letter_reasons"].items() for _ in range(count))

    # The second date again, with one prompt fewer and one new: its output is replaced, never appended to.
    first = published(folders, DATES[1])[2]
    write_input(folders, DATES[1], [*prompts_lines("b", 3), json.dumps({"id": "b-new", "prompt": "a new river"})])
    rerun = run_for(dag, DATES[1], run_conf(local_config, folders, export__model_dir=kept_model, **cpu_workers))
    assert rerun.state == DagRunState.SUCCESS, task_states(rerun)
    answers, _, summary, files = published(folders, DATES[1])
    assert sorted(a["id"] for a in answers) == ["b-0", "b-1", "b-2", "b-new"]
    assert files == ["_SUCCESS", "responses.jsonl"] and summary["run_id"] == rerun.run_id
    assert summary["published_at"] > first["published_at"] and summary["try_number"] >= 1  # which output is newer
    assert published(folders, DATES[0])[2]["run_id"] == runs[DATES[0]].run_id  # the other dates untouched
    no_leftovers(local_config, folders, rerun)


@pytest.mark.parametrize("missing_input", ["skip", "fail"])
def test_a_date_without_input_skips_or_fails_before_anything_is_created(dag, local_config, emulators, folders,
                                                                        missing_input):
    date = pendulum.datetime(2026, 4, 1, tz="UTC")
    # skip waits (deferred) a moment first, in the trigger; fail checks once
    # (the wait and its poll interval are the site's: a run may not lengthen a wait the file sets no limit for)
    wait = {"config_file": site_config("batch-wait.yaml", run_conf(local_config, folders)["config_file"], **{
        "batch.input_wait_s": 1, "batch.input_poll_interval_s": 0.2, "limits.min_poll_interval_s": 0.1}),
        "batch__input_wait_s": 1} if missing_input == "skip" else {}
    run = run_for(dag, date, run_conf(local_config, folders, batch__missing_input=missing_input, **wait))
    states = task_states(run)
    assert states["preflight"] == TaskInstanceState.SUCCESS
    if missing_input == "skip":
        assert run.state == DagRunState.SUCCESS
        assert states["wait_for_input"] == TaskInstanceState.SKIPPED
        assert {states[task] for task in states if task not in ("preflight", "wait_for_input")} == {
            TaskInstanceState.SKIPPED}
    else:
        assert run.state == DagRunState.FAILED
        assert states["wait_for_input"] == TaskInstanceState.FAILED
        assert states["run_batch"] == TaskInstanceState.UPSTREAM_FAILED
    assert not (folders / "answers" / "2026-04-01").exists()
    no_leftovers(local_config, folders, run)


def test_a_decoder_only_model_answers_a_date(dag, local_config, emulators, folders, reference_generate_causal):
    """model.name gpuflow-demo-causal (a Llama-shaped model): exported, checked and served like the T5."""
    date = pendulum.datetime(2026, 5, 1, tz="UTC")
    lines = prompts_lines("d", 6)
    write_input(folders, date, lines)
    run = run_for(dag, date, run_conf(local_config, folders, model__name="gpuflow-demo-causal",
                                      export__model_dir="", gpu__type="nvidia-l4", gpu__machine_type="g2-standard-4"))
    assert run.state == DagRunState.SUCCESS, task_states(run)
    answers, dead_letters, summary, _ = published(folders, date)
    prompts = {json.loads(line)["id"]: json.loads(line)["prompt"] for line in lines}
    assert dead_letters == [] and summary["answered"] == len(prompts)
    assert sorted(a["id"] for a in answers) == sorted(prompts)
    for answer in answers:
        assert answer["model"] == f"gpuflow-demo-causal@{run_prefix(run.dag_id, run.run_id)}"
        assert answer["response"] == reference_generate_causal(answer["prompt"], MAX_NEW_TOKENS), answer["id"]
    no_leftovers(local_config, folders, run)
