"""The environment rules: what a workflow needs of the machine its preflight runs on."""

import sys
from importlib import metadata

import pytest

from gpuflow.configuration.loading import load_config
from gpuflow.preflight.environment_rules import (
    airflow_at_floor,
    gcp_connection_defined,
    launch_environment_matches_container,
)


def test_python_mismatch_names_the_unknown_opcode_symptom():
    other = "3.9" if sys.version_info[:2] != (3, 9) else "3.10"
    found = list(launch_environment_matches_container(load_config(None, overrides=[f"python_version={other}"])))
    assert [f.field for f in found] == ["python_version"]
    assert "unknown opcode" in found[0].problem


def test_beam_mismatch_is_an_error_with_the_installed_version_in_the_fix():
    found = list(launch_environment_matches_container(load_config(None, overrides=["beam_version=2.40.0"])))
    assert [f.field for f in found] == ["beam_version"]
    assert metadata.version("apache-beam") in found[0].fix


def test_gcp_profile_needs_a_readable_connection_and_the_export_fix_clears_it(monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_NO_SUCH_CONN", raising=False)
    missing = list(gcp_connection_defined(load_config(None, overrides=["profile=gcp", "gcp_conn_id=no_such_conn"])))
    assert [(f.field, f.level) for f in missing] == [("gcp_conn_id", "error")]
    assert "export AIRFLOW_CONN_NO_SUCH_CONN=" in missing[0].fix  # outside a task (tests/integration/test_connection_fix.py)
    monkeypatch.setenv("AIRFLOW_CONN_NO_SUCH_CONN", '{"conn_type": "google_cloud_platform"}')
    assert not list(gcp_connection_defined(load_config(None, overrides=["profile=gcp", "gcp_conn_id=no_such_conn"])))


@pytest.mark.parametrize(("package", "installed", "fails"), [
    ("apache-airflow", "3.3.1+composer", False), ("apache-airflow", "3.1.8+composer", False),
    ("apache-airflow", "3.1.7", True), ("apache-airflow-providers-google", "22.2.0", False),
    ("apache-airflow-providers-google", "22.1.0", True), ("apache-airflow-providers-apache-beam", "6.2.1", True),
])
def test_airflow_and_providers_below_the_composer_floor_fail_with_the_upgrade(monkeypatch, package, installed, fails):
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: installed if name == package else real(name))
    findings = list(airflow_at_floor(load_config(None)))
    assert bool(findings) == fails
    if fails:
        assert package in findings[0].problem and "--image-version composer-3-airflow-3.3.1-build" in findings[0].fix
