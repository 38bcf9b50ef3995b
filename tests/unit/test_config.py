import pytest

from gpuflow.config import DEFAULT_CONFIG_FILE, ConfigError, GpuflowConfig
from gpuflow.config_loading import load_config, parse_override


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
