"""A missing Airflow connection: the fix preflight names works where preflight runs, applied as written.

In a task, Airflow reads connections through its execution API, so `airflow connections add` serves; in a shell
(`gpuflow preflight`), Airflow 3 reads only environment variables and secrets backends, so the export serves."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

CONN_ID = "gpuflow_fix_check"
CHECK = ("from gpuflow.configuration.loading import load_config; from gpuflow.preflight.environment_rules import gcp_connection_defined; "
         f"print('FIX:', *[f.fix for f in gcp_connection_defined(load_config(None, overrides=['profile=gcp', "
         f"'gcp_conn_id={CONN_ID}']))])")


def shell(script: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW_CONN_")}
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120, check=True)
    return done.stdout.split("FIX:", 1)[1].splitlines()[0].strip()  # the check's line: its fixes, or nothing


def test_from_a_shell_the_export_named_in_the_fix_clears_the_finding():
    python = shlex.quote(sys.executable)
    fix = shell(f"{python} -c {shlex.quote(CHECK)}")
    export = re.match(r"(export \S+='.*?') in this shell", fix).group(1)
    assert shell(f"{export.replace('PROJECT', 'acme-ml-prod')}; {python} -c {shlex.quote(CHECK)}") == ""


DAG_FILE = f"""
from datetime import datetime

from airflow.sdk import DAG, task


@task
def check():
    exec({CHECK!r})


with DAG("connection_fix_check", schedule=None, start_date=datetime(2026, 1, 1)):
    check()
"""


def test_in_a_task_the_airflow_connections_add_named_in_the_fix_clears_the_finding(tmp_path, migrated_sqlite):
    """As on a fresh machine: a new Airflow home (its database migrated, as `airflow db migrate` makes it), a task
    that runs the check, then the fix as written."""
    import shutil

    (tmp_path / "dags").mkdir()
    (tmp_path / "dags" / "connection_fix_check.py").write_text(DAG_FILE)
    (tmp_path / "home").mkdir()
    shutil.copyfile(migrated_sqlite, tmp_path / "home" / "airflow.db")
    airflow = shlex.quote(str(Path(sys.executable).with_name("airflow")))
    home = (f"export AIRFLOW_HOME={tmp_path / 'home'} AIRFLOW__CORE__DAGS_FOLDER={tmp_path / 'dags'} "
            "AIRFLOW__CORE__LOAD_EXAMPLES=False; ")
    run_check = f"{airflow} dags test connection_fix_check"
    fix = shell(f"{home}{run_check}")
    command = re.match(r"add it where Airflow keeps connections: (airflow connections add .*?') \(", fix).group(1)
    assert shell(f"{home}{command.replace('airflow', airflow, 1).replace('PROJECT', 'acme-ml-prod')} > /dev/null; "
                 f"{run_check}") == ""
