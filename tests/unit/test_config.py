import pytest

from gpuflow.configuration.loading import load_config, parse_override
from gpuflow.configuration.model import DEFAULT_CONFIG_FILE, ConfigError, GpuflowConfig


def test_default_config_file_is_the_local_profile():
    config = load_config(None)
    assert config.profile == "local"
    assert config.model.name == "gpuflow-demo"
    assert load_config(DEFAULT_CONFIG_FILE) == config


def test_set_overrides_are_typed_from_yaml():
    config = load_config(None, overrides=["gpu.count=2", "require_gpu=true", "model.dtype=float32"])
    assert config.gpu.count == 2 and config.require_gpu is True and config.model.dtype == "float32"


def test_params_override_the_file_but_empty_params_do_not():
    config = load_config(None, params={"model__max_new_tokens": 7, "gpu__type": None, "region": ""})
    assert config.model.max_new_tokens == 7
    assert config.gpu.type == "nvidia-l4"
    assert config.region == "us-central1"


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("worker.disk_size_gb=abc", "worker.disk_size_gb"),
        ("model.dtype=float16", "model.dtype"),
        ("project=Bad_Project", "project"),
        ("python_version=3.11.7", "python_version"),
        ("gpu.typo=1", "gpu.typo"),
    ],
)
def test_invalid_values_name_the_field_and_a_fix(override, field):
    with pytest.raises(ConfigError) as raised:
        load_config(None, overrides=[override])
    message = str(raised.value)
    assert f"{field}:" in message
    assert "Fix:" in message


def test_override_without_equals_sign_is_refused():
    with pytest.raises(ConfigError, match="dotted.key=value"):
        parse_override("gpu.count")


def test_missing_config_file_names_the_fix(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_bucket_accepts_a_gs_uri():
    assert GpuflowConfig(bucket="gs://my-bucket/").bucket == "my-bucket"


@pytest.mark.parametrize(("override", "field", "why"), [
    # Pub/Sub ids: a letter first, Pub/Sub's characters, not "goog", 255 in all with gpuflow's prefix
    (f"pubsub.prompts_topic={'t' * 10000}", "pubsub.prompts_topic", "at most"),
    ("pubsub.prompts_topic=my topic/with slash", "pubsub.prompts_topic", "Pub/Sub id"),
    ("pubsub.responses_subscription=google-answers", "pubsub.responses_subscription", "goog"),
    ("pubsub.dead_letter_topic=goog-dead", "pubsub.dead_letter_topic", "goog"),
    ("pubsub.prompts_topic=1prompts", "pubsub.prompts_topic", "a letter first"),
    # Cloud Storage's bucket names
    ("bucket=192.168.5.4", "bucket", "IP address"),
    ("bucket=goog-models", "bucket", "goog"),
    ("bucket=my-google-models", "bucket", "google"),
    ("bucket=a..b", "bucket", "bucket name"),
    # Compute Engine's regions and zones; a region flows into job names
    ("region=us central1", "region", "region name"),
    ("region=us-central1; echo", "region", "region name"),
    ("gpu.zone=us-central1", "gpu.zone", "zone name"),
    # paths: no '.' or '..' segment (a Vertex AI job's bucket mount resolves them), bounded templates
    ("export.model_dir=gs://models/a/../../other", "export.model_dir", "'..'"),
    ("batch.output=gs://b/answers/./{ds}/", "batch.output", "'..'"),
    ("batch.input='{ds:>999999999}'", "batch.input", "plain {name}"),
    ("batch.input=gs://b/{ds!r}/*.jsonl", "batch.input", "plain {name}"),
    ("batch.input=gs://b/{ds", "batch.input", "not a valid path template"),
    # names that reach the gcloud lines preflight prints: no shell syntax
    ("container.repository=gpuflow;rm", "container.repository", "repository id"),
    ("dataflow.subnetwork=regions/us-central1/subnetworks/a b", "dataflow.subnetwork", "regions/R/subnetworks/S"),
    # empty means empty
    ("project=", "project", "must not be empty"),
])
def test_names_google_would_refuse_are_refused_with_the_rule(override, field, why):
    with pytest.raises(ConfigError) as error:
        load_config(None, overrides=[override])
    message = str(error.value)
    assert f"{field}:" in message and "Fix:" in message
    assert why in message, message


def test_names_within_googles_rules_pass():
    config = load_config(None, overrides=["pubsub.prompts_topic=Prompts.v2~x+y%z", "bucket=team.models-1",
                                          "region=europe-west4", "gpu.zone=europe-west4-b",
                                          "batch.input=gs://b/in/{ds}/{ds_nodash}-*.jsonl"])
    assert config.pubsub.prompts_topic == "Prompts.v2~x+y%z" and config.bucket == "team.models-1"


@pytest.mark.parametrize("value", ["line\nsecond", "tab\there", "bell\x07", "esc\x1b[31m"])
def test_control_characters_are_refused_in_any_value(value):
    for key in ("model.name", "dataflow.experiments", "container.image"):
        raw = {"model": {"name": value}} if key == "model.name" else \
            {"dataflow": {"experiments": [value]}} if key == "dataflow.experiments" else {"container": {"image": value}}
        with pytest.raises(Exception, match="control characters"):
            GpuflowConfig.model_validate(raw)


SECRET = "hunter2-do-not-show"


@pytest.mark.parametrize(("content", "where"), [
    (f"project: my-project\nmodel:\n  name: x\n token: {SECRET}: [\n", "line 4"),
    (f"region: us-central1\ngcp_conn_id: [{SECRET}\n", "line 3"),
    (f"key: '{SECRET}\n", "line"),
])
def test_a_broken_config_file_is_named_with_its_line_never_its_text(tmp_path, content, where):
    path = tmp_path / "broken.yaml"
    path.write_text(content)
    with pytest.raises(ConfigError) as error:
        load_config(path)
    message = str(error.value)
    assert str(path) in message and where in message and "Fix:" in message
    assert SECRET not in message and "token" not in message


def test_an_unreadable_or_binary_config_file_is_named_without_its_text(tmp_path):
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe" + SECRET.encode() + b"\x80")
    with pytest.raises(ConfigError, match="not UTF-8") as error:
        load_config(binary)
    assert SECRET not in str(error.value)
    with pytest.raises(ConfigError, match="cannot be read"):
        load_config(tmp_path)  # a folder


def test_a_project_number_in_place_of_the_id_names_the_fix(tmp_path):
    from gpuflow.configuration.loading import load_config
    from gpuflow.configuration.model import ConfigError

    config_file = tmp_path / "numbered.yaml"
    config_file.write_text("profile: gcp\nproject: 123456789012\n")
    with pytest.raises(ConfigError, match=r"project: 123456789012 is a project number; gpuflow needs the project id"
                                          r".*gcloud projects describe 123456789012"):
        load_config(config_file)
