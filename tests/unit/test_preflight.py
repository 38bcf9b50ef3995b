import re

import pytest

from gpuflow.configuration.loading import load_config
from gpuflow.preflight import format_findings, has_errors, run_preflight
from gpuflow.preflight.rules import CONFIG_RULES


def findings_for(*overrides):
    return run_preflight(load_config(None, overrides=list(overrides)), check_environment=False)


def field_findings(findings, field):
    return [f for f in findings if f.field == field]


def test_default_configuration_has_no_config_findings():
    """Nothing to fix; only the cost estimate, which preflight always logs."""
    assert [(f.level, f.field) for f in findings_for()] == [("info", "cost")]


@pytest.mark.parametrize(
    ("overrides", "field", "level", "fix_words"),
    [
        (["worker.disk_size_gb=20"], "worker.disk_size_gb", "error", "50 or more"),
        (["inference.min_batch_size=32", "inference.max_batch_size=8"], "inference.min_batch_size", "error",
         "lower inference.min_batch_size"),
        (["inference.max_batch_duration_secs=0"], "inference.max_batch_duration_secs", "warning", "about 1 second"),
        (["model.name=/does/not/exist"], "model.name", "error", "save_pretrained"),
        (["model.name=google/flan-t5-small"], "model.name", "warning", "gpuflow-demo"),
        (["deployment.mode=persistent"], "bucket", "error", "a bucket that stays"),
        (["deployment.mode=persistent", "bucket=bkt", "export.model_dir=gs://bkt/m"], "export.model_dir",
         "warning", "leave export.model_dir empty"),
    ],
)
def test_each_rule_reports_its_field_and_fix(overrides, field, level, fix_words):
    found = field_findings(findings_for(*overrides), field)
    assert len(found) == 1, found
    assert found[0].level == level
    assert fix_words in found[0].fix


def test_emulator_rule_fails_when_nothing_answers():
    config = load_config(None, overrides=["local.pubsub_emulator_host=localhost:1", "local.storage_emulator_host=http://localhost:1"])
    findings = run_preflight(config)
    assert {f.field for f in findings if f.level == "error"} >= {"local.pubsub_emulator_host", "local.storage_emulator_host"}
    assert has_errors(findings)
    assert "gpuflow emulators start" in format_findings(findings)


def test_every_rule_is_registered_once():
    assert len(CONFIG_RULES) == len(set(CONFIG_RULES))


def test_gcp_profile_needs_a_real_project():
    from gpuflow.preflight.rules import gcp_project_is_real

    placeholder = load_config("configs/gcp.example.yaml")
    found = list(gcp_project_is_real(placeholder))
    assert [(f.field, f.level) for f in found] == [("project", "error")]
    assert not list(gcp_project_is_real(load_config("configs/gcp.example.yaml", overrides=["project=acme-ml-prod"])))


def test_the_demo_model_is_refused_on_gcp_for_inference_only():
    config = load_config("configs/gcp.example.yaml", overrides=["project=acme-ml-prod", "model.name=gpuflow-demo"])
    inference = [f for f in run_preflight(config, check_environment=False) if f.level == "error"]
    assert [(f.field, f.fix) for f in inference] == [
        ("model.name", "set model.name to a Hugging Face hub model, e.g. google/flan-t5-small")]
    assert not [f for f in run_preflight(config, check_environment=False, workflow="dataproc") if f.level == "error"]


@pytest.mark.parametrize(("account", "fails"), [
    ("gpuflow-worker", True), ("gpuflow-worker@acme-ml-prod", True), ("Worker@acme.iam.gserviceaccount.com", True),
    ("gpuflow-worker@acme-ml-prod.iam.gserviceaccount.com", False),
    ("123456789012-compute@developer.gserviceaccount.com", False),
])
def test_a_worker_service_account_that_is_no_email_fails_and_the_fix_clears_it(account, fails):
    from tests.gcp_fakes import gcp_test_config

    findings = [f for f in run_preflight(gcp_test_config(f"dataflow.service_account={account}"),
                                         check_environment=False) if f.field == "dataflow.service_account"]
    assert bool(findings) == fails
    if fails:
        fixed = re.search(r"NAME@(\S+)", findings[0].fix).group(0).replace("NAME", "gpuflow-worker")
        assert not [f for f in run_preflight(gcp_test_config(f"dataflow.service_account={fixed}"),
                                             check_environment=False) if f.field == "dataflow.service_account"]


def test_a_dotted_bucket_name_warns_that_it_needs_domain_verification_at_any_length():
    from gpuflow.configuration.loading import load_config
    from gpuflow.preflight import run_preflight

    for bucket, warned in (("a.b.example.com", True), ("ab.cd", True), ("team-bucket", False)):
        config = load_config("configs/gcp.example.yaml", overrides=[f"bucket={bucket}"])
        fields = {f.field for f in run_preflight(config, check_environment=False) if f.level == "warning"}
        assert ("bucket" in fields) is warned, bucket
