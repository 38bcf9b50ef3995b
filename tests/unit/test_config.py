import pytest

from gpuflow.config import (
    DEFAULT_CONFIG_FILE,
    ConfigError,
    GpuflowConfig,
    load_config,
    param_key_to_dotted,
    params_json_schema,
    parse_override,
)


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


def test_params_schema_has_every_leaf_field_with_its_default_and_real_choices():
    schema = params_json_schema()
    assert {"profile", "model__name", "gpu__type", "local__runner", "inference__max_batch_duration_secs"} <= set(schema)
    for key, entry in schema.items():
        assert entry["key"] == param_key_to_dotted(key)
        assert entry["description"]
    assert schema["profile"] == {**schema["profile"], "enum": ["local", "gcp"], "type": "string", "default": "local"}
    assert schema["bucket"]["type"] == ["null", "string"]  # optional fields alone take null
    assert schema["model__max_new_tokens"]["minimum"] == 1
    assert schema["dataproc__disk_size"]["default"] == 375


def test_the_params_schema_file_is_current():
    """Regenerate with `gpuflow params-schema --write`."""
    import json

    from gpuflow.trigger_form import PARAMS_SCHEMA_FILE

    assert json.loads(PARAMS_SCHEMA_FILE.read_text()) == params_json_schema()


def test_configuration_reference_is_current():
    """Regenerate with `gpuflow config-reference --write`."""
    from gpuflow.config import PROJECT_ROOT, configuration_reference

    assert (PROJECT_ROOT / "docs" / "configuration.md").read_text() == configuration_reference()


def test_the_readmes_configuration_table_is_current():
    """Regenerate with `gpuflow config-reference --write`."""
    from gpuflow.config import PROJECT_ROOT, readme_with_reference

    readme = (PROJECT_ROOT / "README.md").read_text()
    assert readme_with_reference(readme) == readme
