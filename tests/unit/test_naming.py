import pytest

from gpuflow.configuration.model import ConfigError, GpuflowConfig
from gpuflow.runs.naming import resource_names, run_prefix


def test_prefix_is_stable_for_a_run_and_differs_between_runs():
    assert run_prefix("dag", "run-1") == run_prefix("dag", "run-1")
    assert run_prefix("dag", "run-1") != run_prefix("dag", "run-2")
    assert run_prefix("dag", "manual__2026-01-01T00:00:00+00:00").startswith("gf-")


def test_run_scoped_bucket_when_none_is_configured():
    names = resource_names(GpuflowConfig(), "gf-abc")
    assert names.bucket == "gpuflow-local-gf-abc" and names.bucket_is_run_scoped
    assert names.state_dict_uri == "gs://gpuflow-local-gf-abc/gpuflow/gf-abc/model/state_dict.pth"
    assert all(name.startswith("gf-abc-") for name in [*names.topics, *names.subscriptions])
    assert names.subscriptions[names.prompts_subscription] == names.prompts_topic


def test_configured_bucket_is_shared_and_only_the_prefix_is_the_runs():
    names = resource_names(GpuflowConfig(bucket="team-bucket"), "gf-abc")
    assert names.bucket == "team-bucket" and not names.bucket_is_run_scoped
    assert names.model_dir_uri == "gs://team-bucket/gpuflow/gf-abc/model"


def test_a_persistent_run_serves_on_its_deployments_topics_and_owns_only_its_smoke_subscriptions():
    from gpuflow.configuration.loading import load_config
    from gpuflow.runs.naming import resource_names

    for profile, job_subscription in (("gcp", "gfd-chat-prompts-sub"), ("local", "gfd-chat-prompts-sub-0123456789")):
        config = load_config(None, overrides=[f"profile={profile}", "project=gpuflow-unit-test", "bucket=bkt",
                                              "deployment.mode=persistent", "deployment.name=chat"])
        names = resource_names(config, "gf-0123456789")
        assert names.topics == ["gfd-chat-prompts", "gfd-chat-responses", "gfd-chat-dead-letters"]
        assert names.run_topics == []
        assert names.prompts_subscription == job_subscription
        assert names.owns_job_subscription is (profile == "local")
        assert sorted(names.run_subscriptions) == ["gf-0123456789-dead-letters-sub", "gf-0123456789-responses-sub"]
        assert names.model_dir_uri == "gs://bkt/gpuflow/deployments/chat/versions/gf-0123456789"
        assert names.model_version == "gpuflow-demo@gf-0123456789"
        assert names.job_name.startswith("gfd-chat-0123456789-")
    ephemeral = resource_names(load_config(None), "gf-0123456789")
    assert ephemeral.run_topics == ephemeral.topics and ephemeral.deployment is None
    assert not ephemeral.owns_job_subscription


def test_labels_and_job_names_follow_googles_rules():
    """Labels (Resource Manager's requirements) and Dataflow job names (its Job.name pattern) are checked where made."""
    from gpuflow.configuration.loading import load_config
    from gpuflow.dataflow.options import job_name_for
    from gpuflow.runs.naming import resource_names

    config = load_config("configs/gcp.example.yaml", overrides=["deployment.mode=persistent", "deployment.name=prod-eu"])
    names = resource_names(config, "gf-0123456789")
    assert names.labels == {"gpuflow-run": "gf-0123456789", "gpuflow-deployment": "prod-eu"}
    assert job_name_for(names, config, "llm-inference") == "gfd-prod-eu-0123456789-llm-inference-us-central1-l4"
    with pytest.raises(ValueError, match="label rule"):
        _ = names.model_copy(update={"deployment": "Prod EU"}).labels
    odd = config.model_copy(update={"gpu": config.gpu.model_copy(update={"type": "NVIDIA_L4"})})
    with pytest.raises(ConfigError, match="Dataflow's rule"):
        job_name_for(names, odd, "llm-inference")


@pytest.mark.parametrize(("file_name", "site"), [("team-a.yaml", "team-a"), ("ml_ops2.yaml", "ml_ops2"),
                                                 ("gcp.example.yaml", ""), ("Team.yaml", "")])
def test_every_resource_is_labelled_with_the_site_whose_file_made_it(tmp_path, file_name, site):
    """A janitor judges its own site's resources only (gpuflow.steps.janitor): the site rides in every label set,
    and in the lease that objects, which carry no labels, lie beside. A file that names no site gives no label."""
    from gpuflow.configuration.loading import load_config
    from gpuflow.runs.naming import SITE_LABEL, resource_names

    config_file = tmp_path / file_name
    config_file.write_text("profile: local\n")
    names = resource_names(load_config(config_file), "gf-0123456789")
    assert names.labels.get(SITE_LABEL, "") == site
    assert names.labels["gpuflow-run"] == "gf-0123456789"
