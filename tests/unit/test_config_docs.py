"""The files generated from the configuration model match it: the Params schema and the configuration reference."""

import json

from gpuflow.config_docs import configuration_reference, params_json_schema, readme_with_reference
from gpuflow.config_loading import param_key_to_dotted
from gpuflow.paths import PROJECT_ROOT
from gpuflow.trigger_form import PARAMS_SCHEMA_FILE


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
    assert json.loads(PARAMS_SCHEMA_FILE.read_text()) == params_json_schema()


def test_configuration_reference_is_current():
    """Regenerate with `gpuflow config-reference --write`."""
    assert (PROJECT_ROOT / "docs" / "configuration.md").read_text() == configuration_reference()


def test_the_readmes_configuration_table_is_current():
    """Regenerate with `gpuflow config-reference --write`."""
    readme = (PROJECT_ROOT / "README.md").read_text()
    assert readme_with_reference(readme) == readme
