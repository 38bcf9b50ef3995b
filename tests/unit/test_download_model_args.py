"""download_model.py keeps the guide's two modes; vertex mode only builds the job here (no Vertex AI)."""

import pytest

import download_model


def test_local_mode_arguments():
    args = download_model.build_arg_parser().parse_args(
        ["local", "--model-name", "google/flan-t5-small", "--state-dict-path", "gs://b/p/state_dict.pth"]
    )
    assert (args.mode, args.model_name, args.state_dict_path) == ("local", "google/flan-t5-small", "gs://b/p/state_dict.pth")


def test_vertex_mode_is_accepted_and_runs_local_mode_on_the_gcs_mount():
    args = download_model.build_arg_parser().parse_args(
        ["vertex", "--model-name", "google/flan-t5-xl", "--state-dict-path", "gs://b/m/state_dict.pth",
         "--job-name", "export", "--project", "p", "--bucket", "gs://b"]
    )
    assert args.mode == "vertex" and args.machine_type == "e2-highmem-2" and args.disk_size_gb == 100
    assert download_model.vertex_job_args(args.model_name, args.state_dict_path) == [
        "local", "--model-name=google/flan-t5-xl", "--state-dict-path=/gcs/b/m/state_dict.pth",
    ]


def test_a_mode_is_required():
    with pytest.raises(SystemExit):
        download_model.build_arg_parser().parse_args(["--model-name", "x"])
