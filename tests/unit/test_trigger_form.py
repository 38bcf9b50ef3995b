"""The trigger form: per-run fields first, folded sections of key=value lines, every field showing the value
the run will use, and a run's conf turned into exactly the settings it changed."""

import pytest
from airflow.sdk import Param
from airflow.sdk.definitions.param import ParamValidationError

from gpuflow.config_loading import load_config
from gpuflow.trigger_form import RUN_SECTION, SECTIONS, FormLayout, dag_params, run_settings, settings_lines
from tests.helpers import dag_forms

LAYOUTS = dag_forms()  # each DAG file's own form
DAG_IDS = sorted(LAYOUTS)


def config_value(config, dotted: str):
    node = config.model_dump(mode="json")
    for part in dotted.split("."):
        node = node[part] if node is not None else None
    return node


@pytest.mark.parametrize("dag_id", DAG_IDS)
def test_per_run_fields_come_first_with_labels_and_the_rest_fold_into_named_sections(dag_id):
    params = dag_params(LAYOUTS[dag_id])
    layout = LAYOUTS[dag_id]
    run_fields = [key.replace(".", "__") for key in layout.run_fields]
    assert list(params)[: len(run_fields)] == run_fields
    for key in run_fields:
        dotted = key.replace("__", ".")
        assert "section" not in params[key].schema  # Airflow's unfolded "Run Parameters"
        assert params[key].schema["title"] != dotted and "_" not in params[key].schema["title"]
        assert params[key].description.startswith(f"{dotted}: ")
    sections = [params[key].schema.get("section") for key in list(params)[len(run_fields):]]
    assert RUN_SECTION not in sections and None not in sections
    assert [s for s in sections if s in SECTIONS] == list(layout.sections)


@pytest.mark.parametrize("dag_id", DAG_IDS)
def test_every_field_shows_the_value_the_run_will_use(dag_id):
    """Defaults come from the config file (or the model's default), so they equal the validated config."""
    params = dag_params(LAYOUTS[dag_id])
    config = load_config(LAYOUTS[dag_id].config_file)
    for dotted in LAYOUTS[dag_id].run_fields:
        assert params[dotted.replace(".", "__")].value == config_value(config, dotted), dotted
    for title in LAYOUTS[dag_id].sections:
        lines = settings_lines(params[SECTIONS[title].param].value)
        assert lines, title
        for line in lines:
            key = line.split("=", 1)[0]
            assert load_config(LAYOUTS[dag_id].config_file, overrides=[line]) == config, line
            assert SECTIONS[title].owns(key)
    assert params["config_file"].value == LAYOUTS[dag_id].config_file


def test_enums_offer_their_real_choices_only():
    params = dag_params(LAYOUTS["llm_streaming_inference"])
    assert params["profile"].schema["enum"] == ["local", "gcp"]
    assert params["profile"].schema["type"] == "string"
    assert params["bucket"].schema["type"] == ["null", "string"]  # empty bucket: a bucket per run


def test_a_section_field_refuses_keys_of_other_sections_and_malformed_lines():
    field: Param = dag_params(LAYOUTS["llm_streaming_inference"])["smoke_test_settings"]
    field.resolve("smoke_test.num_prompts=3\n\n# a comment\n  smoke_test.timeout_s = 60\n")
    for text in ("gpu.count=2", "smoke_test.num_prompts", "smoke_test.typo=1", "num_prompts=3"):
        with pytest.raises(ParamValidationError):
            field.resolve(text)


def form_values(layout) -> dict:
    return {key: param.value for key, param in dag_params(layout).items()}


def test_an_untouched_form_asks_for_nothing_beyond_the_config_file():
    config_file, changed, lines = run_settings(LAYOUTS["llm_streaming_inference"], form_values(LAYOUTS["llm_streaming_inference"]))
    assert (config_file, changed, lines) == ("configs/local.yaml", {}, [])


def test_changed_fields_and_lines_override_and_untouched_ones_take_the_named_files_values():
    values = form_values(LAYOUTS["llm_streaming_inference"])
    values["gpu__count"] = 2
    values["smoke_test_settings"] = values["smoke_test_settings"].replace("smoke_test.num_prompts=8",
                                                                          "smoke_test.num_prompts=3")
    values["config_file"] = "configs/gcp.example.yaml"
    config = load_config(*run_settings(LAYOUTS["llm_streaming_inference"], values))
    expected = load_config("configs/gcp.example.yaml", overrides=["gpu.count=2", "smoke_test.num_prompts=3"])
    assert config == expected
    assert config.profile == "gcp"  # the form showed "local", untouched: the named file decides


def test_a_conf_of_single_keys_still_works():
    conf = {"model__max_new_tokens": 7, "smoke_test__num_prompts": 4, "local__state_dir": "/tmp/x", "gpu__zone": ""}
    config = load_config(*run_settings(LAYOUTS["llm_streaming_inference"], {**form_values(LAYOUTS["llm_streaming_inference"]), **conf}))
    assert (config.model.max_new_tokens, config.smoke_test.num_prompts, config.local.state_dir) == (7, 4, "/tmp/x")
    assert config.gpu.zone is None


def test_clearing_a_field_the_file_sets_clears_it(tmp_path, monkeypatch):
    config_file = tmp_path / "with-bucket.yaml"
    config_file.write_text("bucket: team-bucket\n")
    layout = FormLayout(str(config_file), ("profile", "bucket"), LAYOUTS["gpu_quota_report"].sections)
    values = form_values(layout)
    assert values["bucket"] == "team-bucket"
    assert load_config(*run_settings(layout, values)).bucket == "team-bucket"
    assert load_config(*run_settings(layout, {**values, "bucket": None})).bucket is None


@pytest.mark.parametrize("value", ["nvidia-l4", "g2-standard-4", "gs://b/x", "3.11", "2.77.0", "true", "off", "no",
                                   "null", "", " padded", "a: b", "[x", "#x", "us-docker.pkg.dev/v/t:latest", 8, 1.5,
                                   True, None, ["a", "b"], {"k": 1}])
def test_every_value_reads_back_from_its_line_as_itself(value):
    from gpuflow.config_loading import parse_override
    from gpuflow.trigger_form import format_value

    # parse_override keeps a float's text (pydantic reads it), so that "3.10" stays a string.
    expected = str(value) if isinstance(value, float) else value
    assert parse_override(f"key={format_value(value)}") == ("key", expected)
