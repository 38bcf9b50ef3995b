"""The trigger form: per-run fields first, then folded sections of typed fields, every field showing the value the
run will use and refusing a bad one, and a run's conf turned into exactly the settings it sends."""

import pytest
from airflow.sdk.definitions.param import ParamValidationError

from gpuflow.configuration.loading import load_config
from gpuflow.configuration.model import ConfigError
from gpuflow.runs.run_policy import run_request
from gpuflow.runs.trigger_form import (
    LABELS,
    RUN_SECTION,
    SECTIONS,
    SETTINGS_SECTION,
    FormLayout,
    dag_params,
)
from tests.helpers import dag_forms

LAYOUTS = dag_forms()  # each DAG file's own form
DAG_IDS = sorted(LAYOUTS)
STREAMING = LAYOUTS["llm_streaming_inference"]


def config_value(config, dotted: str):
    node = config.model_dump(mode="json")
    for part in dotted.split("."):
        node = node[part] if node is not None else None
    return node


@pytest.mark.parametrize("dag_id", DAG_IDS)
def test_per_run_fields_come_first_then_each_section_of_typed_fields_each_with_a_label(dag_id):
    params = dag_params(LAYOUTS[dag_id])
    layout = LAYOUTS[dag_id]
    run_fields = [key.replace(".", "__") for key in layout.run_fields]
    assert list(params)[: len(run_fields)] == run_fields
    for key, param in params.items():
        if key == "config_file":
            continue
        dotted = key.replace("__", ".")
        assert param.schema["title"] == LABELS[dotted] and "_" not in param.schema["title"], dotted
        assert param.description.startswith(f"{dotted}: ")
        assert param.schema["type"] not in ("array", "object")  # lists and maps stay in the file
        if key in run_fields:
            assert "section" not in param.schema  # Airflow's unfolded "Run Parameters"
        else:
            section = param.schema["section"]
            assert section == SETTINGS_SECTION or dotted in SECTIONS[section].keys
    sections = [params[key].schema["section"] for key in list(params)[len(run_fields):]]
    assert RUN_SECTION not in sections
    assert list(dict.fromkeys(s for s in sections if s != SETTINGS_SECTION)) == [
        title for title in layout.sections if any(k not in layout.run_fields for k in SECTIONS[title].keys)]


@pytest.mark.parametrize("dag_id", DAG_IDS)
def test_every_field_shows_the_value_the_run_will_use(dag_id):
    """Defaults come from the config file (or the model's default), so they equal the validated config."""
    params = dag_params(LAYOUTS[dag_id])
    config = load_config(LAYOUTS[dag_id].config_file)
    for key, param in params.items():
        if key != "config_file":
            assert param.value == config_value(config, key.replace("__", ".")), key
    assert params["config_file"].value == LAYOUTS[dag_id].config_file


def test_enums_offer_their_real_choices_only():
    params = dag_params(STREAMING)
    assert params["deployment__mode"].schema["enum"] == ["ephemeral"]  # configs/local.yaml allows no lasting one
    assert params["deployment__mode"].schema["type"] == "string"
    assert params["gpu__sharing"].schema["enum"] == ["auto", "single_process", "mps", "model_copies"]
    assert params["export__model_dir"].schema["type"] == ["null", "string"]  # empty: under the run's prefix


@pytest.mark.parametrize(("key", "bad"), [("gpu__count", "many"), ("gpu__count", 0), ("gpu__sharing", "shared"),
                                          ("smoke_test__num_prompts", -1), ("model__chat_template", "maybe"),
                                          ("gpu__model_copies", 17)])
def test_a_bad_value_is_refused_by_its_own_field(key, bad):
    field = dag_params(STREAMING)[key]
    with pytest.raises(ParamValidationError):
        field.resolve(bad)
    field.resolve(field.value)  # the shown value passes


@pytest.mark.parametrize(("dag_id", "key", "bad"), [
    ("llm_streaming_inference", "export__model_dir", "gs://models/a/../b"),
    ("llm_batch_inference", "batch__output", "/tmp/gpuflow/../../home/"),
    ("llm_batch_inference", "batch__input", "/tmp/gpuflow/./x/*.jsonl"),
    ("llm_batch_inference", "batch__output", "/tmp/gpuflow/a\nb/"),
])
def test_a_path_with_a_dot_segment_or_a_control_character_is_refused_by_its_field(dag_id, key, bad):
    field = dag_params(LAYOUTS[dag_id])[key]
    with pytest.raises(ParamValidationError):
        field.resolve(bad)
    field.resolve(field.value)
    field.resolve("gs://team/answers.v2/{ds}/..x/")


@pytest.mark.parametrize("other", ["configs/gcp.example.yaml", "configs/../../../etc/passwd.yaml", "../secrets.yaml",
                                   ""])
def test_the_configuration_file_field_holds_the_dags_own_file_only(other):
    """The form shows the site's file as its one choice, so a conf naming any other is refused at trigger."""
    field = dag_params(STREAMING)["config_file"]
    with pytest.raises(ParamValidationError):
        field.resolve(other)
    assert field.resolve(STREAMING.config_file) == "configs/local.yaml"


def form_values(layout) -> dict:
    return {key: param.value for key, param in dag_params(layout).items()}


def run_config(layout, params, conf):
    """The configuration a run of ``layout`` with ``conf`` reads (``params``: what Airflow validated), as preflight
    builds it (``operators.run_config.config_from_params``, less the run policy's checks)."""
    request = run_request(layout, [], params, conf or {})
    return load_config(layout.config_file, request.defaults, run_values=request.values)


def test_a_run_without_conf_takes_the_configuration_file():
    for conf in (None, {}):
        request = run_request(STREAMING, [], form_values(STREAMING), conf or {})
        assert request.values == {}
        assert run_config(STREAMING, form_values(STREAMING), conf) == load_config("configs/local.yaml")


def test_what_a_run_sends_wins_even_a_value_equal_to_the_files():
    """The form sends every field, its read-only file too: each field wins over the site's file, which gives the
    keys the form does not show."""
    gcp = FormLayout("configs/gcp.example.yaml", STREAMING.run_fields, STREAMING.sections)
    sent = {**form_values(gcp), "gpu__count": 2, "smoke_test__num_prompts": 3}
    config = run_config(gcp, sent, sent)
    gcp_file = load_config("configs/gcp.example.yaml")
    assert (config.profile, config.gpu.machine_type, config.gpu.count, config.smoke_test.num_prompts) == (
        "gcp", gcp_file.gpu.machine_type, 2, 3)  # the profile is the file's: no run field sets it
    shown = {key.replace("__", ".") for key in sent}
    assert config.dataflow.experiments == gcp_file.dataflow.experiments  # not in the form: from the file
    assert "dataflow.experiments" not in shown


def test_a_conf_of_single_declared_fields_sets_those_alone():
    conf = {"model__max_new_tokens": 7, "smoke_test__num_prompts": 4, "gpu__zone": ""}
    config = run_config(STREAMING, {**form_values(STREAMING), **conf}, conf)
    assert (config.model.max_new_tokens, config.smoke_test.num_prompts, config.gpu.zone) == (7, 4, None)
    assert config.model_dump(exclude={"model", "smoke_test"}) == load_config("configs/local.yaml").model_dump(
        exclude={"model", "smoke_test"})


def test_a_key_the_form_does_not_declare_refuses_the_run_naming_every_such_key():
    conf = {"model__max_new_tokens": 7, "local__state_dir": "/tmp/x", "pubsub__prompts_topic": "questions",
            "dataproc": {"main_python_file": "/x.py"}, "project=other #": None, "model.name": "x"}
    with pytest.raises(ConfigError) as refused:
        run_request(STREAMING, [], {**form_values(STREAMING), **conf}, conf)
    for key in ("local__state_dir", "pubsub__prompts_topic", "'dataproc'", "'project=other #'", "'model.name'"):
        assert key in str(refused.value), key
    assert "model__max_new_tokens" not in str(refused.value)


def test_clearing_a_field_the_file_sets_clears_it(tmp_path):
    config_file = tmp_path / "with-bucket.yaml"
    config_file.write_text("bucket: team-bucket\n")
    layout = FormLayout(str(config_file), ("profile", "bucket"), LAYOUTS["gpu_quota_report"].sections)
    values = form_values(layout)
    assert values["bucket"] == "team-bucket"
    assert run_config(layout, values, values).bucket == "team-bucket"
    assert run_config(layout, {**values, "bucket": None}, {"bucket": None}).bucket is None


@pytest.mark.parametrize("dag_id", DAG_IDS)
def test_every_field_names_draft_07_which_its_schema_keeps_to(dag_id):
    """Airflow validates a scheduled DAG's Params at every parse; draft-07's meta-schema check is the cheap one."""
    from jsonschema.validators import Draft7Validator, validator_for

    for key, param in dag_params(LAYOUTS[dag_id]).items():
        assert validator_for(param.schema) is Draft7Validator, key
        Draft7Validator.check_schema(param.schema)


def test_the_docs_give_each_dags_sections_in_the_forms_order():
    """docs/trigger-form.md says the order the form shows its sections in; each DAG's form follows it."""
    from gpuflow.runs.trigger_form import dag_form
    from tests.helpers import ROOT, dag_bag

    text = " ".join((ROOT / "docs" / "trigger-form.md").read_text().split())
    shared = ["Model", "GPU", "Dataflow workers", "Container", "Export", "Inference batching", "Smoke test"]
    assert "then " + ", ".join(shared[:-1]) + " and " + shared[-1] in text
    own = {"llm_streaming_inference": "Deployment", "llm_batch_inference": "Batch"}
    for dag_id, dag in dag_bag().dags.items():
        sections = list(dag_form(dag).sections)
        if dag_id in own:
            assert sections == [own[dag_id], *shared], dag_id
            assert f"{own[dag_id]} in `{dag_id}`" in text
        else:
            (section,) = sections
            assert f"`{dag_id}` shows {section}" in text, dag_id


def test_a_cost_knobs_description_states_the_files_limit_or_that_it_has_none():
    from tests.helpers import site_config

    unlimited = dag_params(STREAMING)
    assert "sets no limits.max_gpus: a run may not raise it above the file's value (1)" in \
        unlimited["gpu__count"].description
    assert "limits." not in unlimited["model__max_new_tokens"].description  # no cost knob
    limited = FormLayout(site_config("form-limits.yaml", **{"limits.max_gpus": 8}), STREAMING.run_fields,
                         STREAMING.sections)
    assert "Bounded by the configuration file's limits.max_gpus = 8" in dag_params(limited)["gpu__count"].description


def test_the_path_pattern_refuses_every_control_and_format_character_of_the_bmp():
    """Derived from Unicode's own tables: the pattern's class is exactly the BMP's Cc and Cf characters."""
    import re
    import unicodedata

    from gpuflow.runs.trigger_form import PATH_PATTERN, UNSAFE_BMP

    unsafe = {chr(code) for code in range(0x10000) if unicodedata.category(chr(code)) in ("Cc", "Cf")}
    in_class = {chr(code) for code in range(0x10000) if re.fullmatch(f"[{UNSAFE_BMP}]", chr(code))}
    assert in_class == unsafe
    assert re.match(PATH_PATTERN, "/tmp/gpuflow/answers/{ds}/")
    assert not re.match(PATH_PATTERN, "/tmp/gpuflow/answers\u202e/") and not re.match(PATH_PATTERN, "a\u0085b")


def site_form(**values):
    """The streaming form of a site file: configs/local.yaml with ``values`` (dotted keys) over it."""
    from tests.helpers import site_config

    return dag_params(FormLayout(site_config("bounded.yaml", **values), STREAMING.run_fields, STREAMING.sections))


def test_without_limits_a_run_may_lower_a_cost_knob_and_never_raise_it():
    """A site that sets no limit: each cost knob's field holds the file's value as its bound (Airflow refuses more at
    trigger), as the run policy holds it in preflight."""
    params = site_form(**{"gpu.count": 2, "worker.max_num_workers": 3, "smoke_test.timeout_s": 240})
    for key, above, within in (("gpu__count", 3, 1), ("worker__max_num_workers", 4, 3), ("gpu__type", "nvidia-a100-80gb", "none"),
                               ("deployment__mode", "persistent", "ephemeral"), ("smoke_test__timeout_s", 241, 60),
                               ("gpu__machine_type", "a2-ultragpu-8g", "g2-standard-4"),
                               ("region", "europe-west4", "us-central1")):
        with pytest.raises(ParamValidationError):
            params[key].resolve(above)
        params[key].resolve(within)


def test_a_sites_limits_bound_its_fields():
    params = site_form(**{"limits.max_gpus": 8, "limits.gpu_types": ["nvidia-l4", "nvidia-tesla-t4"],
                          "limits.lasting_deployments": True, "limits.max_job_hours": 2,
                          "limits.max_usd_per_hour": 40, "limits.regions": ["europe-west4", "us-central1"]})
    assert params["gpu__count"].schema["maximum"] == 8 and params["worker__max_num_workers"].schema["maximum"] == 8
    assert params["gpu__type"].schema["enum"] == ["nvidia-l4", "none", "nvidia-tesla-t4"]
    assert params["deployment__mode"].schema["enum"] == ["ephemeral", "persistent"]
    assert params["smoke_test__timeout_s"].schema["maximum"] == 7200
    assert "enum" not in params["gpu__machine_type"].schema  # priced in preflight against limits.max_usd_per_hour
    with pytest.raises(ParamValidationError):
        params["gpu__count"].resolve(9)
    with pytest.raises(ParamValidationError):
        params["gpu__type"].resolve("nvidia-h100-80gb")
    assert params["gpu__type"].resolve("nvidia-tesla-t4") == "nvidia-tesla-t4"
    assert params["region"].schema["enum"] == ["us-central1", "europe-west4"]
    with pytest.raises(ParamValidationError):
        params["region"].resolve("asia-east1")


def test_a_file_beyond_its_own_limits_still_parses():
    """The bound never excludes the file's own value (preflight says what is wrong with the file)."""
    params = site_form(**{"gpu.count": 4, "limits.max_gpus": 2})
    assert params["gpu__count"].resolve(4) == 4
    with pytest.raises(ParamValidationError):
        params["gpu__count"].resolve(5)
