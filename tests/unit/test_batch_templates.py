"""The batch DAG's paths: templates filled per run (runs/batch_templates.py), the staging folders beside the final
ones (runs/batch_paths.py), and preflight's checks of them."""

import pytest

from gpuflow.configuration.loading import load_config
from gpuflow.configuration.model import ConfigError
from gpuflow.platform.files import count_lines_in
from gpuflow.preflight import run_preflight
from gpuflow.runs.batch_paths import staging_folder
from gpuflow.runs.batch_templates import date_fields, fill_batch_paths

FIELDS = {"ds": "2026-03-01", "ds_nodash": "20260301"}


def config(*overrides, path="configs/gcp.example.yaml"):
    return load_config(path, overrides=["project=my-real-project", *overrides])


def test_the_defaults_are_filled_with_the_bucket_and_the_date():
    filled = fill_batch_paths(config("bucket=team-llm"), FIELDS).batch
    assert (filled.input, filled.output, filled.dead_letter_output) == (
        "gs://team-llm/prompts/2026-03-01/*.jsonl", "gs://team-llm/answers/2026-03-01/",
        "gs://team-llm/dead_letters/2026-03-01/")


def test_a_folder_is_given_its_slash():
    assert config("batch.output=gs://bkt/answers/{ds_nodash}").batch.output == "gs://bkt/answers/{ds_nodash}/"


@pytest.mark.parametrize(("overrides", "fields", "words"), [
    (["bucket="], FIELDS, "bucket is empty"),  # a run-scoped bucket would take the answers with it
    (["bucket=bkt", "batch.input=gs://bkt/{date}/*.jsonl"], FIELDS, "['date'], which no run fills"),
    (["bucket=bkt"], {}, "no logical date"),
])
def test_a_path_that_cannot_be_filled_says_why_and_the_fix(overrides, fields, words):
    with pytest.raises(ConfigError, match="Fix:") as raised:
        fill_batch_paths(config(*overrides), fields)
    assert words in str(raised.value)


def test_date_fields_come_from_the_runs_context():
    import pendulum

    start = pendulum.datetime(2026, 3, 1, tz="UTC")
    fields = date_fields({"ds": "2026-03-01", "ds_nodash": "20260301", "ts_nodash": "20260301T000000",
                          "data_interval_start": start, "data_interval_end": start.add(days=1)})
    assert fields["data_interval_start"] == "2026-03-01T00:00:00+00:00" and fields["ds"] == "2026-03-01"


def test_staging_lies_beside_the_final_folder_under_a_name_readers_skip():
    assert staging_folder("gs://bkt/answers/2026-03-01/", "gf-1") == "gs://bkt/answers/_gpuflow-staging-gf-1-2026-03-01/"
    assert staging_folder("/data/out/", "gf-1") == "/data/_gpuflow-staging-gf-1-out/"


def batch_errors(*overrides, path="configs/gcp.example.yaml"):
    filled = fill_batch_paths(config("bucket=bkt", *overrides, path=path), FIELDS)
    return {(f.field, f.problem) for f in run_preflight(filled, check_environment=False,
                                                                        workflow="batch") if f.level == "error"
            and f.field.startswith("batch.")}


def test_batch_paths_that_preflight_refuses():
    assert batch_errors() == set()
    assert {field for field, _ in batch_errors("batch.input=/data/prompts/*.jsonl")} == {"batch.input"}  # gcp
    assert batch_errors("batch.input=/data/prompts/*.jsonl", "batch.output=/data/answers/",
                        "batch.dead_letter_output=/data/dead/", path=None) == set()  # local paths: local profile
    assert {field for field, _ in batch_errors("batch.dead_letter_output=gs://bkt/answers/{ds}/dead/")} == {
        "batch.dead_letter_output"}  # inside the answers folder: one publish would delete the other
    assert {field for field, _ in batch_errors("batch.input=gs://bkt/answers/{ds}/in/*.jsonl")} == {"batch.input"}
    assert {field for field, _ in batch_errors("batch.output=gs://bkt/answers/*/")} == {"batch.output"}


def test_right_fitting_with_one_worker_is_refused_for_streaming_only():
    hinted = fill_batch_paths(config("bucket=bkt", "gpu.request=resource_hint", "worker.max_num_workers=1",
                                     "model.name=google/flan-t5-large"), FIELDS)
    def fields(workflow):
        return {f.field for f in run_preflight(hinted, check_environment=False, workflow=workflow)
                if f.level == "error"}
    assert "worker.max_num_workers" in fields("inference") and "worker.max_num_workers" not in fields("batch")


@pytest.mark.parametrize(("chunks", "lines"), [
    ([], 0), ([b""], 0), ([b"a\n"], 1), ([b"a"], 1), ([b"a\nb"], 2), ([b"a\n", b"b\n"], 2), ([b"a\r\nb\r\n"], 2),
    ([b"\n\n"], 2), ([b"a", b"\n", b"b"], 2)])
def test_lines_are_counted_as_beams_text_source_reads_them(chunks, lines):
    assert count_lines_in(chunks) == lines


def test_an_output_under_gpuflows_own_prefix_is_refused_and_another_folder_clears_it():
    """Publishing replaces files in the output folder: never among gpuflow's records, model versions and leases."""
    from gpuflow.configuration.loading import load_config

    config = load_config("configs/gcp.example.yaml", overrides=["batch.output=gs://{bucket}/gpuflow/answers/{ds}/"])
    with pytest.raises(ConfigError, match=r"batch.output .* gpuflow's own prefix .*Fix: pick another folder"):
        fill_batch_paths(config, {"ds": "2026-03-01"})
    fixed = config.model_copy(update={"batch": config.batch.model_copy(update={"output": "gs://{bucket}/answers/{ds}/"})})
    assert fill_batch_paths(fixed, {"ds": "2026-03-01"}).batch.output.endswith("/answers/2026-03-01/")
