"""What is generated from the configuration model: each field's Params schema (tests/unit/test_generated.py keeps the
files current)."""


from gpuflow.configuration.loading import param_key_to_dotted
from gpuflow.tools.config_docs import params_json_schema


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
