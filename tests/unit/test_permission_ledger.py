"""Every call gpuflow's jobs make on their own machines (beam_jobs/google_calls.yaml, declared beside the code) is
allowed by a role that docs/gcp.md's checklist grants the identity they run as, and that preflight --access checks
(catalog/access.yaml, worker_service_account). Removing a grant from the catalog makes this fail."""

import copy

import pytest
import yaml

from gpuflow.catalog import access_table
from tests.helpers import ROOT

pytestmark = pytest.mark.timeout(60)

DECLARED = yaml.safe_load((ROOT / "beam_jobs" / "google_calls.yaml").read_text())


def checked_worker_roles(table: dict) -> list[list[str]]:
    """The worker account's role requirements preflight --access checks: each a list of roles, any of which does."""
    return [[table["worker_role"]], table["registry_read_roles"], table["bucket_roles"],
            table["pubsub_roles"]["consume"], table["pubsub_roles"]["publish"]]


def ungranted(table: dict) -> list[str]:
    """The declared worker and export calls that no checked role requirement allows."""
    held = DECLARED["role_permissions"]
    problems = []
    for job in ("workers", "export"):
        assert DECLARED[job]["identity"] == "worker_service_account"
        for call in DECLARED[job]["calls"]:
            allowed = any(all(call["permission"] in held.get(role, []) for role in roles)
                          for roles in checked_worker_roles(table))
            if not allowed:
                problems.append(f"{job}: {call['call']} ({call['permission']})")
    return problems


def test_every_declared_job_call_is_granted_and_checked():
    assert ungranted(access_table("worker_service_account")) == []


@pytest.mark.parametrize("removed", ["consume", "publish"])
def test_removing_the_workers_pubsub_grant_from_the_catalog_fails_the_ledger(removed):
    table = copy.deepcopy(access_table("worker_service_account"))
    table["pubsub_roles"][removed] = ["roles/none"]
    problems = ungranted(table)
    assert problems and all("pubsub" in problem for problem in problems), problems


def test_the_checklist_grants_the_least_role_of_each_requirement():
    """docs/gcp.md's step 4 grants, for each requirement, a role that meets it (the first listed: the least)."""
    import re

    text = (ROOT / "docs" / "gcp.md").read_text()
    step4 = text[text.index("4. **The workers' service account**"):text.index("5. **Cloud Build's account**")]
    granted = set(re.findall(r"--role=(\S+)", step4))
    for roles in checked_worker_roles(access_table("worker_service_account")):
        assert granted & set(roles), roles
