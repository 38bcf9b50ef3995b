"""`gpuflow launch-command --check`: Beam's DataflowRunner stages the direct launch's job into a local GCS emulator
(nothing reaches Google) and the request is checked against Dataflow's documented constraints."""

from gpuflow.tools.cli import main


def run_check(local_config, *overrides):
    emulators = [f"local.pubsub_emulator_host={local_config.local.pubsub_emulator_host}",
                 f"local.storage_emulator_host={local_config.local.storage_emulator_host}"]
    settings = ["project=acme-ml-prod", "bucket=gpuflow-launch-check", *emulators, *overrides]
    return main(["launch-command", "--check", "--config", "configs/gcp.example.yaml",
                 *(item for setting in settings for item in ("--set", setting))])


def test_a_right_fitting_streaming_launch_passes_the_request_check(gcp_env, local_config, capsys):
    """(gcp_env: the staging subprocess gets anonymous credentials at once, instead of Beam's ~20 s of retries.)"""
    assert run_check(local_config, "gpu.request=resource_hint", "worker.max_num_workers=2") == 0
    assert "# request check: ok" in capsys.readouterr().err


def test_a_gpu_job_on_beams_own_image_fails_the_request_check_with_the_guides_rule(emulators, local_config, capsys):
    """(A Flex Template launch: its request is checked as built, nothing is staged.)"""
    assert run_check(local_config, "launch.mode=flex_template", "container.image=apache/beam_python3.11_sdk:2.77.0") == 1
    err = capsys.readouterr().err
    assert "request check: the flex template launch asks for GPUs without a custom container image" in err
    assert "custom-container" in err and "../shared/guides/000" in err and "# request check: FAILED" in err
