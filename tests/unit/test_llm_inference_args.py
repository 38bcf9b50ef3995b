"""Argument handling of beam_jobs/llm_inference.py (no pipeline runs here)."""

import pytest

import llm_handlers
import llm_inference
import llm_models

BASE = ["--model-name", "m", "--state-dict-path", "s.pth"]


def test_batch_mode_passes_the_rest_to_beam():
    args, beam_args = llm_inference.parse_args([*BASE, "--input", "in.jsonl", "--output", "out/", "--runner", "X"])
    assert args.input == "in.jsonl" and beam_args == ["--runner", "X"]


def test_streaming_mode_needs_all_three_pubsub_arguments():
    with pytest.raises(SystemExit):
        llm_inference.parse_args([*BASE, "--messages-subscription", "projects/p/subscriptions/s"])


def test_modes_do_not_mix():
    with pytest.raises(SystemExit):
        llm_inference.parse_args([*BASE, "--input", "a", "--output", "b", "--responses-topic", "t"])


def test_output_paths(tmp_path):
    assert llm_inference.output_paths("out/") == ("out/responses.jsonl", "out/dead_letters.jsonl", "out/summary.json")
    assert llm_inference.output_paths("run1") == ("run1-responses.jsonl", "run1-dead_letters.jsonl",
                                                  "run1-summary.json")
    assert llm_inference.output_paths("gs://b/a/", "gs://b/d") == ("gs://b/a/responses.jsonl",
                                                                  "gs://b/d/dead_letters.jsonl", "gs://b/a/summary.json")
    assert llm_inference.output_paths(str(tmp_path))[0] == f"{tmp_path}/responses.jsonl"


def test_the_dag_publishes_the_files_the_job_writes():
    """gpuflow's publish step names the batch job's files without importing the job (no Beam on Airflow's side)."""
    from gpuflow.steps import batch

    assert (batch.ANSWERS_FILE, batch.DEAD_LETTERS_FILE, batch.SUMMARY_FILE) == (
        llm_inference.ANSWERS_FILE, llm_inference.DEAD_LETTERS_FILE, llm_inference.SUMMARY_FILE)


def test_streaming_batching_crosses_bundles_only_in_streaming():
    args, _ = llm_inference.parse_args([*BASE, "--input", "a", "--output", "b/", "--max-batch-duration-secs", "2"])
    assert "max_batch_duration_secs" not in llm_inference.make_model_handler(args, streaming=False).batch_elements_kwargs()
    assert llm_inference.make_model_handler(args, streaming=True).batch_elements_kwargs()["max_batch_duration_secs"] == 2


def test_group_by_length_uses_beams_length_buckets():
    args, _ = llm_inference.parse_args([*BASE, "--input", "a", "--output", "b/", "--group-by-length"])
    kwargs = llm_inference.make_model_handler(args, streaming=False).batch_elements_kwargs()
    assert kwargs["length_fn"](("id", "text", [1, 2, 3])) == 3
    assert kwargs["bucket_boundaries"] == llm_handlers.LENGTH_BUCKETS


def test_fp16_is_refused():
    with pytest.raises(ValueError, match="fp16 overflows"):
        llm_models.choose_device_and_dtype("float16")


STREAMING = [*BASE, "--messages-subscription", "projects/p/subscriptions/s", "--responses-topic", "projects/p/topics/r",
             "--dead-letter-topic", "projects/p/topics/d"]


def test_the_side_input_refresh_refuses_a_folder_without_a_pointer(tmp_path):
    """Beam's WatchFilePattern needs a pointer at startup; without one the job would hold every prompt."""
    import apache_beam as beam

    args, _ = llm_inference.parse_args([*STREAMING, "--model-refresh-folder", str(tmp_path)])
    with pytest.raises(llm_inference.NoVersionPointer, match="no model version pointer matches"):
        llm_inference.model_versions(beam.Pipeline(), args, streaming=True)
    (tmp_path / "0001796000000-v1.json").write_text('{"version": "v1"}')
    assert llm_inference.model_versions(beam.Pipeline(), args, streaming=True) is not None
    # The local profile's poll needs no pointer at startup.
    args, _ = llm_inference.parse_args([*STREAMING, "--model-refresh-folder", str(tmp_path / "none"),
                                        "--model-refresh", "poll"])
    assert llm_inference.model_versions(beam.Pipeline(), args, streaming=True) is None
