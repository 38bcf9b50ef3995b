"""docs/gcp.md's checklist, from an empty project to the first answer: the commands that can run offline, run exactly
as written; the roles and APIs it names are the catalog's, which preflight checks."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

PAGE = ROOT / "docs" / "gcp.md"


def checklist() -> str:
    text = PAGE.read_text()
    return text[text.index("## From an empty project to the first answer"):text.index("## What each task does")]


def offline_commands() -> list[str]:
    return [line.split("# offline")[0].strip() for line in checklist().splitlines() if line.rstrip().endswith(
        "# offline")]


@pytest.fixture
def workspace(tmp_path):
    """Step 9 done: site/team-a.yaml, the example with a project, a bucket and the workers' account set."""
    (tmp_path / "site").mkdir()
    text = (ROOT / "configs" / "gcp.example.yaml").read_text()
    text = text.replace("project: my-gcp-project", "project: acme-ml-prod").replace(
        "bucket: my-gcp-project-gpuflow", "bucket: acme-ml-prod-gpuflow").replace(
        "service_account: null", "service_account: gpuflow-worker@acme-ml-prod.iam.gserviceaccount.com")
    (tmp_path / "site" / "team-a.yaml").write_text(text)
    return tmp_path


def test_the_offline_steps_run_as_written_and_say_what_the_page_promises(workspace):
    commands = offline_commands()
    assert [command.split()[:2] for command in commands] == [["gpuflow", "preflight"], ["gpuflow", "launch-command"]]
    promised = {"preflight": "preflight: ok", "launch-command": "# request check: ok"}
    gpuflow = Path(sys.executable).with_name("gpuflow")
    env = {**os.environ, "GPUFLOW_SITE_DIR": str(workspace / "site")}
    for command in commands:
        ran = subprocess.run([str(gpuflow), *command.split()[1:]], cwd=workspace, capture_output=True, text=True,
                             env=env, timeout=300)
        assert ran.returncode == 0, (command, ran.stdout[-2000:], ran.stderr[-2000:])
        assert promised[command.split()[1]] in ran.stdout + ran.stderr, command


def test_the_roles_and_apis_the_checklist_names_are_the_ones_preflight_checks():
    from gpuflow.catalog import access_table

    text = checklist()
    workers, build = access_table("worker_service_account"), access_table("build_service_account")
    step4 = text[text.index("4. **The workers' service account**"):text.index("5. **Cloud Build's account**")]
    roles = set(re.findall(r"--role=(\S+)", step4))
    assert roles == {workers["worker_role"], workers["registry_read_roles"][0], "roles/storage.objectAdmin",
                     workers["act_as"]["role"], workers["pubsub_roles"]["consume"][0],
                     workers["pubsub_roles"]["publish"][0]}
    assert "roles/storage.objectAdmin" in workers["bucket_roles"]
    step5 = text[text.index("5. **Cloud Build's account**"):text.index("6. **GPU quota**")]
    assert set(re.findall(r"`(roles/[\w.]+)`", step5)) == set(build["needs"])
    generated = PAGE.read_text()
    enable = re.search(r"gcloud services enable (.*) --project=PROJECT", generated).group(1).split()
    assert set(access_table("check_reads")["apis"]) <= set(enable)
