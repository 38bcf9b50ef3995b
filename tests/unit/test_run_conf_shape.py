"""A run's conf holds config_file and its DAG's declared fields, nothing else, and each value is set as a value
(gpuflow.runs.run_policy.run_request). The tables come from the configuration model, so a new section or field is
covered without editing this file."""

from __future__ import annotations

import json
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuflow.configuration.loading import load_config
from gpuflow.configuration.model import ConfigError, unsafe_character
from gpuflow.runs.run_policy import check_run_conf, run_request
from gpuflow.runs.trigger_form import PARAMS_SCHEMA_FILE, dag_params, declared_fields
from tests.helpers import dag_forms

pytestmark = pytest.mark.timeout(120)

LAYOUTS = dag_forms()
#: Every leaf field of the configuration model and every section, from the generated schema of the model.
LEAVES = sorted(schema["key"] for schema in json.loads(PARAMS_SCHEMA_FILE.read_text()).values())
SECTIONS = sorted({dotted.split(".")[0] for dotted in LEAVES if "." in dotted})


def form_values(layout) -> dict:
    return {key: param.value for key, param in dag_params(layout).items()}


def test_the_tables_are_the_models():
    assert {"model", "gpu", "dataproc", "limits", "allowed", "local"} <= set(SECTIONS)
    assert {"gcp_conn_id", "project", "dataproc.main_python_file", "limits.max_usd_per_hour"} <= set(LEAVES)


@pytest.mark.parametrize("dag_id", sorted(LAYOUTS))
def test_every_section_sent_as_one_key_is_refused(dag_id):
    layout = LAYOUTS[dag_id]
    for section in SECTIONS:
        conf = {section: {"anything": 1}}
        with pytest.raises(ConfigError, match=repr(section)):
            run_request(layout, [], {**form_values(layout), **conf}, conf)


@pytest.mark.parametrize("dag_id", sorted(LAYOUTS))
def test_every_fields_dotted_name_with_equals_and_hash_is_refused(dag_id):
    layout = LAYOUTS[dag_id]
    for dotted in LEAVES:
        for key in (dotted, f"{dotted}=x #", f"{dotted.replace('.', '__')}=x #", f"{dotted.replace('.', '__')} #"):
            if key in declared_fields(layout):
                continue
            conf = {key: None}
            with pytest.raises(ConfigError, match="does not declare"):
                run_request(layout, [], {**form_values(layout), **conf}, conf)


def test_every_undeclared_key_is_named_in_one_message():
    layout = LAYOUTS["llm_streaming_inference"]
    conf = {"gcp_conn_id=another_teams_conn #": None, "project=another-project #": None, "dataproc": {}}
    with pytest.raises(ConfigError) as refused:
        run_request(layout, [], form_values(layout), conf)
    assert "3 key(s)" in str(refused.value)
    assert all(repr(key) in str(refused.value) for key in conf)


def test_the_cc_and_cf_check_knows_every_such_code_point():
    """Derived from Unicode's own tables (unicodedata), not a list: every Cc and Cf character is refused."""
    import sys

    unsafe = [chr(code) for code in range(sys.maxunicode + 1)
              if unicodedata.category(chr(code)) in ("Cc", "Cf")]
    assert len(unsafe) > 200 and "\u202e" in unsafe and "\u0085" in unsafe
    assert all(unsafe_character(f"a{character}b") for character in unsafe)
    assert unsafe_character("plain text: é, 東京, emoji 🙂") is None


# -- property: whatever keys and values a conf holds, the configuration is the file's, or the run is refused --------

#: What keys and values are made of: the characters that YAML, dotted keys and logs read specially, format and control
#: characters, and pieces of real field names, so that some generated keys are declared fields.
FRAGMENTS = [*"=#:\n\r\"' {}[]-._~ax019", "\u202e", "\u0085", "\u200b", "\ufeff", "__", "gpu", "count", "project",
             "gcp_conn_id", "dataproc", "model__max_new_tokens", "gpu__count", "smoke_test__num_prompts", "null",
             "true"]
TRICKY = st.lists(st.sampled_from(FRAGMENTS), max_size=6).map("".join)
VALUES = st.one_of(st.none(), TRICKY, st.integers(-5, 10 ** 6), st.booleans(),
                   st.lists(TRICKY, max_size=3), st.dictionaries(TRICKY, TRICKY, max_size=2))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conf=st.dictionaries(TRICKY, VALUES, max_size=4))
def test_a_generated_conf_yields_the_files_configuration_or_a_refusal(conf):
    """Either the run is refused, or every field the conf did not name as a declared field is the file's."""
    layout = LAYOUTS["llm_streaming_inference"]
    base = load_config(layout.config_file)
    conf = {key: value for key, value in conf.items() if key != "config_file"}
    try:
        request = run_request(layout, [], {**form_values(layout), **conf}, conf)
        check_run_conf(request.values, base)
        config = load_config(layout.config_file, request.defaults, run_values=request.values)
    except ConfigError:
        return  # refused, with a message
    assert set(request.values) <= set(declared_fields(layout).values())
    moved = [dotted for dotted in LEAVES if _value(config, dotted) != _value(base, dotted)]
    assert set(moved) <= set(request.values), moved


def _value(config, dotted):
    node = config
    for part in dotted.split("."):
        node = getattr(node, part, None)
    return node
