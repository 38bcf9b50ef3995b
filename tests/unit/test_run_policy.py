"""What a run's conf may choose (gpuflow.runs.run_policy): knobs yes; code, identity, files outside the project and what
gets deleted, no. Each refusal names the key and the fix, and applying the fix clears it."""


import pytest

from gpuflow.configuration.loading import load_config
from gpuflow.configuration.model import ConfigError
from gpuflow.runs.run_policy import check_run_conf, refusal, run_request
from tests.helpers import ROOT, site_config

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def local():
    return load_config("configs/local.yaml")


@pytest.fixture
def gcp():
    return load_config("configs/gcp.example.yaml")


#: (dotted key, value, the class of escalation): each refused over configs/local.yaml
HOSTILE = [
    ("dataproc.main_python_file", "/usr/lib/python3.11/antigravity.py", "code"),
    ("dataproc.args", ["-c", "open('/tmp/owned', 'w')"], "code"),
    ("export.pip_packages", ["evil==1.0"], "code"),
    ("export.container_image", "docker.io/evil/image:latest", "code"),
    ("container.image", "docker.io/evil/worker:latest", "code"),
    ("container.recipe", "../../etc/passwd", "code"),
    ("local.runner", "DataflowRunner", "code"),
    ("model.name", "/etc", "code"),
    ("model.name", "evil-org/backdoored-model", "code"),
    ("gcp_conn_id", "prod_admin", "identity"),
    ("dataflow.service_account", "admin@other.iam.gserviceaccount.com", "identity"),
    ("impersonation_chain", ["admin@other.iam.gserviceaccount.com"], "identity"),
    ("project", "another-team-project", "where things are deleted"),
    ("bucket", "another-team-bucket", "where things are deleted"),
    ("local.state_dir", "/", "where things are deleted"),
    ("pubsub.prompts_topic", "team-topic", "where things are deleted"),
    ("local.pubsub_emulator_host", "10.0.0.1:8085", "where data goes"),
    ("batch.output", "/etc/", "paths"),
    ("batch.output", "/tmp/gpuflow/../../home/", "paths"),
    ("batch.input", "gs://another-bucket/*.jsonl", "paths"),
    ("export.model_dir", "gs://another-bucket/models", "paths"),
    ("region", "us-central1; rm -rf /", "names"),
    ("gpu.machine_type", "g2-standard-4\necho owned", "names"),
    ("deployment.name", "prod eu", "names"),
    ("profile", "gcp", "the file's own"),
    ("batch.schedule", "* * * * *", "parse time"),
    ("allowed.models", ["/etc"], "the allow-list itself"),
]


@pytest.mark.parametrize(("dotted", "value", "kind"), HOSTILE, ids=[f"{k}-{d}" for d, _, k in HOSTILE])
def test_a_hostile_key_is_refused_naming_the_key_and_the_fix(local, dotted, value, kind):
    problem = refusal(dotted, value, local)
    assert problem and problem.startswith(f"{dotted}: ") and "Fix:" in problem, problem
    with pytest.raises(ConfigError, match=dotted.replace(".", r"\.")):
        check_run_conf({dotted: value, "gpu.count": 2}, local)


@pytest.mark.parametrize(("dotted", "value"), [
    ("gpu.count", 1), ("smoke_test.timeout_s", 120.0), ("require_gpu", True), ("gpu.sharing", "mps"),
    ("deployment.mode", "ephemeral"), ("janitor.dry_run", True), ("region", "us-central1"),
    ("gpu.type", "none"), ("gpu.zone", "us-central1-a"), ("deployment.name", "prod-eu"),
    ("model.name", "gpuflow-demo-causal"), ("container.recipe", "cpu"), ("container.image", None),
    ("batch.output", "/tmp/gpuflow/batch/answers/{ds}/"), ("model.parameters_m", None),
    ("local.pipeline_start_timeout_s", 30),
])
def test_knobs_and_checked_names_pass(local, dotted, value):
    assert refusal(dotted, value, local) is None


def test_a_value_equal_to_the_files_passes_whatever_the_key(gcp):
    """The form sends every field it shows, with the file's values: those change nothing."""
    for dotted, value in (("project", gcp.project), ("gcp_conn_id", gcp.gcp_conn_id), ("model.name", gcp.model.name),
                          ("dataflow.experiments", gcp.dataflow.experiments), ("dataflow.service_account", None)):
        assert refusal(dotted, value, gcp) is None, dotted


def test_applying_each_fix_clears_the_refusal(tmp_path):
    """The fixes the messages name: list the model, the image prefix, the gs:// prefix in the file."""
    sent = {"model.name": "google/flan-t5-xl", "container.image": "us-docker.pkg.dev/acme/gpuflow/l4:abc",
            "export.model_dir": "gs://acme-models/flan", "batch.output": "gs://acme-answers/day/"}
    gcp = load_config("configs/gcp.example.yaml")
    assert all(refusal(key, value, gcp) for key, value in sent.items())
    fixed = load_config(site_config("allowing.yaml", "configs/gcp.example.yaml", **{
        "allowed.models": ["google/flan-t5-xl"], "allowed.images": ["us-docker.pkg.dev/acme/gpuflow/"],
        "allowed.gcs_prefixes": ["gs://acme-models/", "gs://acme-answers"]}))
    check_run_conf(sent, fixed)  # no refusal left


def test_gpuflows_own_prefix_is_never_a_runs_to_write(gcp):
    for path in (f"gs://{gcp.bucket}/gpuflow/", f"gs://{gcp.bucket}/gpuflow/deployments/prod/", "gs://{bucket}/gpuflow/x/"):
        assert "gpuflow's own prefix" in refusal("batch.output", path, gcp), path
    assert refusal("batch.output", f"gs://{gcp.bucket}/answers/{{ds}}/", gcp) is None


@pytest.mark.parametrize("named", ["/etc/passwd", "configs/gcp.example.yaml", "configs/../../../etc/x.yaml",
                                   str(ROOT / "plugins" / "gpuflow" / "catalog" / "gpus.yaml"), 42])
def test_a_conf_that_names_another_configuration_file_is_refused(named):
    """A run's configuration file is its DAG's (its site's, fixed at parse): a conf naming any other is refused,
    with the reason and the fix, and reads nothing."""
    from gpuflow.runs.trigger_form import FormLayout

    layout = FormLayout(site_config("team.yaml"), run_fields=("region",), sections=())
    with pytest.raises(ConfigError, match=r"does not declare: 'config_file'.*no configuration file either.*Fix:"):
        run_request(layout, [], {}, {"config_file": named})


def test_a_conf_that_names_its_own_dags_file_changes_nothing():
    """The form sends its read-only field back: the site's own file, accepted, and no value set from it."""
    from gpuflow.runs.trigger_form import FormLayout

    layout = FormLayout(site_config("team.yaml"), run_fields=("region",), sections=())
    request = run_request(layout, [], {"region": "europe-west4"},
                          {"config_file": layout.config_file, "region": "europe-west4"})
    assert request.values == {"region": "europe-west4"}


# -- cost: without a limit a run may not raise a cost knob; with one, preflight bounds it -----------------------------

#: (dotted key, a value above configs/local.yaml's, the limit that lets a run raise it)
RAISES = [
    ("worker.max_num_workers", 1000, {"limits.max_gpus": 8}),
    ("gpu.count", 8, {"limits.max_gpus": 8}),
    ("deployment.mode", "persistent", {"limits.lasting_deployments": True}),
    ("batch.job_timeout_s", 10 ** 7, {"limits.max_job_hours": 12}),
    ("gpu.type", "nvidia-h100-80gb", {"limits.gpu_types": ["nvidia-l4", "nvidia-h100-80gb"]}),
    ("gpu.machine_type", "a3-megagpu-8g", {"limits.max_usd_per_hour": 5}),
]


@pytest.mark.parametrize(("dotted", "value", "limit"), RAISES, ids=[d for d, _, _ in RAISES])
def test_a_run_may_not_raise_a_cost_knob_the_file_sets_no_limit_for(local, dotted, value, limit):
    problem = refusal(dotted, value, local)
    assert problem and "would raise this run's cost" in problem, problem
    for name in limit:
        assert name in problem, (name, problem)
    assert refusal(dotted, value, load_config(site_config(f"limits-{dotted}.yaml", **limit))) is None


def test_a_run_may_not_leave_the_files_region_unless_the_site_lists_others(local):
    problem = refusal("region", "europe-west4", local)
    assert problem and "would move this run out of the configuration file's" in problem and "limits.regions" in problem
    listed = load_config(site_config("regions.yaml", **{"limits.regions": ["europe-west4"]}))
    assert refusal("region", "europe-west4", listed) is None and refusal("region", "us-central1", local) is None


def test_lowering_a_cost_knob_needs_no_limit(local):
    more = load_config(site_config("more-workers.yaml", **{"worker.max_num_workers": 4, "gpu.count": 2}))
    assert refusal("worker.max_num_workers", 2, more) is None and refusal("gpu.count", 1, more) is None


def test_lasting_deployments_false_refuses_even_a_file_that_is_persistent():
    config = load_config(site_config("no-lasting.yaml", **{"deployment.mode": "persistent",
                                                          "limits.lasting_deployments": False}))
    assert "limits.lasting_deployments" in refusal("deployment.mode", "persistent", config.model_copy(
        update={"deployment": config.deployment.model_copy(update={"mode": "ephemeral"})}))


# -- paths: compared by segment, wildcards that cannot reach past their folder -----------------------------------------

@pytest.mark.parametrize(("dotted", "path"), [
    ("batch.input", "gs://{bucket}/gpuflo[w]/deployments/**"),
    ("batch.input", "gs://{bucket}/{gpuflow,x}/**"),
    ("batch.input", "gs://{bucket}/**"),
    ("batch.input", "gs://{bucket}/gpuflow/*.jsonl"),
    ("batch.input", "gs://{bucket}/prompts/*/x.jsonl"),
    ("batch.input", "gs://{bucket}/prompts/?.jsonl"),
    ("batch.input", "gs://{bucket}/prompts/[!a]x.jsonl"),
    ("batch.input", "gs://{bucket}/gpuflow"),
    ("export.model_dir", "gs://{bucket}/gpuflow"),
    ("export.model_dir", "gs://{bucket}/models/*"),
    ("batch.output", "gs://{bucket}//gpuflow/"),
    ("batch.output", "gs://{bucket}/answers/{ds:>99}/"),
    ("batch.output", "gs://{bucket}/answers\u202e/"),
    ("batch.output", "gs://{bucket}/answers\u0085/"),
    ("batch.output", "gs://{bucket}/ans\u200bwers/"),
])
def test_a_path_that_could_reach_gpuflows_prefix_or_hide_what_it_is_is_refused(gcp, dotted, path):
    assert refusal(dotted, path.replace("{bucket}", gcp.bucket), gcp), path
    assert refusal(dotted, path, gcp), path


@pytest.mark.parametrize(("dotted", "path"), [
    ("batch.input", "gs://{bucket}/prompts/{ds}/*.jsonl"), ("batch.input", "gs://{bucket}/*.jsonl"),
    ("batch.input", "gs://{bucket}/gpuflo*"), ("batch.output", "gs://{bucket}/gpuflow-answers/"),
    ("export.model_dir", "gs://{bucket}/models/flan"),
])
def test_a_path_in_its_own_folder_passes(gcp, dotted, path):
    assert refusal(dotted, path, gcp) is None, refusal(dotted, path, gcp)


def test_prefixes_are_compared_at_a_segment_boundary():
    config = load_config(site_config("segments.yaml", "configs/gcp.example.yaml", **{
        "allowed.images": ["us-docker.pkg.dev/acme/gpuflow"], "allowed.gcs_prefixes": ["gs://acme-answers/team"]}))
    for image in ("us-docker.pkg.dev/acme/gpuflow-evil/x:1", "us-docker.pkg.dev/acme/gpuflow.attacker.io/x:1"):
        assert refusal("container.image", image, config), image
    for image in ("us-docker.pkg.dev/acme/gpuflow/l4:1", "us-docker.pkg.dev/acme/gpuflow:1"):
        assert refusal("container.image", image, config) is None, image
    assert refusal("batch.output", "gs://acme-answers/team-b/", config)
    assert refusal("batch.output", "gs://acme-answers/team/day/", config) is None
