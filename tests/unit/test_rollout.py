"""gpuflow.runs.rollout: which path a deployment's change takes, and why."""

import pytest

from gpuflow.configuration.loading import load_config
from gpuflow.runs.rollout import DeploymentRecord, job_options, plan_rollout, pointer_name

IMAGE = "us-central1-docker.pkg.dev/p/gpuflow/l4:1"


def gcp(*overrides):
    return load_config("configs/gcp.example.yaml", overrides=["project=gpuflow-unit-test", "bucket=bkt",
                                                              "deployment.mode=persistent", *overrides])


def recorded(config, image=IMAGE) -> DeploymentRecord:
    return DeploymentRecord(name="chat", job={"kind": "dataflow", "id": "j1", "name": "gfd-chat-x", "location": "r"},
                            job_name="gfd-chat-x", subscription="gfd-chat-prompts-sub", image=image,
                            model_version="m@gf-1", model_dir_uri="gs://b/v/1", state_dict_uri="gs://b/v/1/s.pth",
                            options=job_options(config))


def test_no_record_is_a_new_deployment_and_a_dead_job_is_replaced():
    config = gcp()
    assert plan_rollout(config, None, IMAGE, job_running=False).path == "new"
    gone = plan_rollout(config, recorded(config), IMAGE, job_running=False)
    assert (gone.path, gone.record.job_name) == ("replace", "gfd-chat-x") and "no longer runs" in gone.why


def test_unchanged_image_and_options_roll_out_the_weights_alone():
    config = gcp()
    plan = plan_rollout(gcp("smoke_test.num_prompts=3", "export.timeout_s=60"), recorded(config), IMAGE, True)
    assert (plan.path, plan.changed) == ("weights", []) and "automatic model refresh" in plan.why


@pytest.mark.parametrize(("overrides", "image", "path", "changed"), [
    (["inference.max_batch_size=8"], IMAGE, "update", ["inference.max_batch_size"]),
    ([], IMAGE + "2", "update", ["image"]),
    (["worker.max_num_workers=4", "model.max_new_tokens=32"], IMAGE, "update",
     ["model.max_new_tokens", "worker.max_num_workers"]),
    (["gpu.count=2", "gpu.machine_type=g2-standard-24"], IMAGE, "replace", ["gpu.count", "gpu.machine_type"]),
    (["inference.group_by_length=false"], IMAGE + "2", "replace", ["inference.group_by_length", "image"]),
    (["region=us-east4"], IMAGE, "replace", ["region"]),
])
def test_an_updatable_change_updates_in_place_and_any_other_replaces(overrides, image, path, changed):
    plan = plan_rollout(gcp(*overrides), recorded(gcp()), image, job_running=True)
    assert (plan.path, plan.changed) == (path, changed), plan.why
    assert all(key in plan.why for key in changed)


def test_the_local_runner_replaces_what_dataflow_would_update():
    local = load_config(None, overrides=["bucket=bkt", "deployment.mode=persistent"])
    plan = plan_rollout(load_config(None, overrides=["bucket=bkt", "deployment.mode=persistent",
                                                     "inference.max_batch_size=8"]), recorded(local), IMAGE, True)
    assert plan.path == "replace" and "cannot update a job in place" in plan.why


def test_pointer_names_sort_by_when_they_were_written():
    names = [pointer_name("m@gf-9", 99.5), pointer_name("m/x@gf-1", 1000.25), pointer_name("m@gf-5", 5.0)]
    assert sorted(names) == [names[2], names[0], names[1]]
    assert names[1] == "0000001000.250000-m_x_gf-1.json"


def test_an_empty_launch_mode_is_recorded_as_the_mode_it_resolves_to():
    """A deployment made before launch.mode was written down, or with it written, is the same job: no replace."""
    from gpuflow.runs.rollout import job_options
    from tests.gcp_fakes import gcp_test_config

    assert gcp_test_config().launch.mode is None
    assert job_options(gcp_test_config())["launch.mode"] == "flex_template" == job_options(
        gcp_test_config("launch.mode=flex_template"))["launch.mode"]
    assert job_options(gcp_test_config("launch.mode=direct"))["launch.mode"] == "direct"
