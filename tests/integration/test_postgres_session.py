"""The test session's PostgreSQL (tests/postgres.py), on which the live Airflow tests run Airflow's services."""

import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT

THIS_TEST = ("tests/integration/test_postgres_session.py::"
             "test_the_session_server_listens_on_loopback_as_an_unprivileged_user")


def test_the_session_server_listens_on_loopback_as_an_unprivileged_user(postgres_server):
    settings = dict(postgres_server.query("postgres", "SELECT name, setting FROM pg_settings WHERE name IN "
                                                      "('listen_addresses', 'port', 'data_directory')"))
    assert settings == {"listen_addresses": "127.0.0.1", "port": str(postgres_server.port),
                        "data_directory": postgres_server.data_dir}
    [(superuser,)] = postgres_server.query("postgres", "SELECT rolsuper FROM pg_roles WHERE rolname = 'postgres'")
    assert superuser
    owner = os.stat(postgres_server.data_dir).st_uid
    assert owner != 0, "PostgreSQL's data folder is root's: the server refuses to run as root"
    assert not postgres_server.data_dir.startswith("/tmp/pytest-of-"), "inside pytest's 0700 temporary folders"


def test_each_airflow_home_gets_a_database_of_its_own(postgres_server):
    first, second = (postgres_server.database_url(f"home_{os.getpid()}_{n}") for n in (1, 2))
    assert first != second
    names = {name for (name,) in postgres_server.query("postgres", "SELECT datname FROM pg_database")}
    assert {first.rsplit("/", 1)[1], second.rsplit("/", 1)[1]} <= names


@pytest.mark.timeout(120)
def test_without_postgresql_programs_the_session_stops_at_once_naming_the_fix(tmp_path):
    """No fallback to SQLite: a session whose server cannot start ends there, with the fix, before any test runs."""
    empty = tmp_path / "no-postgresql"
    empty.mkdir()
    env = {**os.environ, "GPUFLOW_TEST_POSTGRES_BINDIR": str(empty)}
    answer = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q",
                             THIS_TEST], cwd=ROOT, env=env, capture_output=True, text=True, timeout=110)
    output = answer.stdout + answer.stderr
    assert answer.returncode == 3, output
    assert "the test session's PostgreSQL did not start" in output, output
    assert f"are not in ['{empty}']" in output, output
    assert "Fix: install Debian's PostgreSQL server (`apt-get install postgresql`" in output, output
    assert " passed" not in output, output
