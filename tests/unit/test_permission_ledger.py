"""The permission ledger: every (identity, permission) gpuflow's Google calls need is granted and checked.

- The caller's calls (the identity Airflow uses): every method the offline tests' fakes answer, which is every
  method gpuflow's code can call on those APIs (a method a fake does not answer fails its test), has its permission
  in catalog/api_permissions.yaml (from each API's REST reference), and that permission is one preflight --access
  checks for the caller (catalog/access.yaml, the workflows' needs) or one of the check's own reads.
- The jobs' calls on their own machines (beam_jobs/google_calls.yaml, declared beside the code) are allowed by a role
  that docs/gcp.md's checklist grants the identity they run as, and that preflight --access checks
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


# -- the caller's calls -------------------------------------------------------------------------------------------

API_PERMISSIONS = yaml.safe_load((ROOT / "plugins" / "gpuflow" / "catalog" / "api_permissions.yaml").read_text())


def _key(class_name: str, method: str, api: str) -> str:
    """A method as api_permissions.yaml names it: Class.method, the API first where two APIs share a class name."""
    return f"{api}.{class_name}.{method}" if class_name == "ProjectsClient" else f"{class_name}.{method}"


def answered_methods() -> set[str]:
    """Every Google API method the fakes answer: the provider hooks' clients, gpuflow's own clients, the access
    check's clients, Dataflow's REST resource and Dataproc's batch controller."""
    from google.cloud import dataflow_v1beta3
    from googleapiclient.discovery_cache import get_static_doc

    from tests.gcp_fakes.access import FakeProjectAccess
    from tests.gcp_fakes.clients import CLOUD_BUILD_REQUESTS, DATAFLOW_REQUESTS, VERTEX_REQUESTS, own_clients
    from tests.gcp_fakes.dataflow import FakeDataflowRest
    from tests.integration.test_dag_dataproc import FakeBatchController

    methods = set()
    for method in DATAFLOW_REQUESTS:
        owner = next(name for name in ("JobsV1Beta3Client", "MessagesV1Beta3Client")
                     if hasattr(getattr(dataflow_v1beta3, name), method))
        methods.add(_key(owner, method, "dataflow"))
    methods |= {_key("JobServiceClient", method, "aiplatform") for method in VERTEX_REQUESTS}
    methods |= {_key("CloudBuildClient", method, "cloudbuild") for method in CLOUD_BUILD_REQUESTS}
    for module, name, requests, _ in own_clients():
        api = module.__name__.split(".")[-1].split("_")[0]
        methods |= {_key(name, method, api) for method in requests}
    for name, answers in FakeProjectAccess()._answers().items():
        methods |= {_key(name, method, "resourcemanager") for method in answers}
    methods |= {"storage.Bucket.get_iam_policy", "storage.Bucket.test_iam_permissions"}  # FakeStorageAccess
    # Dataflow's REST resource (DataflowHook's discovery client): each of the fake's methods, on each resource whose
    # method of that name takes the same parameters (launch: the templates; get and update: a jobId, the jobs).
    import inspect
    import json

    document = json.loads(get_static_doc("dataflow", "v1b3"))
    resources = document["resources"]["projects"]["resources"]["locations"]["resources"]
    for method in ("launch", "get", "update", "list"):
        if not hasattr(FakeDataflowRest, method):
            continue
        parameters = inspect.signature(getattr(FakeDataflowRest, method)).parameters
        required = {name for name, parameter in parameters.items()
                    if name != "self" and parameter.default is inspect.Parameter.empty}
        for resource, spec in resources.items():
            described = spec.get("methods", {}).get(method)
            if described and required <= set(described.get("parameters", {})) | {"body"}:
                methods.add(f"dataflow.{resource}.{method}")
    methods |= {f"BatchControllerClient.{method}" for method in ("create_batch", "get_batch", "delete_batch")
                if hasattr(FakeBatchController, method)}
    return methods


def checked_caller_permissions() -> set[str]:
    """What preflight --access checks the caller holds (every workflow's needs) or reads as the check itself."""
    from gpuflow.catalog import access_needs

    needs = access_needs()
    held = {permission for need in needs.values() for permission in need.permissions}
    return held | set(access_table("check_reads")["permissions"])


def test_every_method_the_fakes_answer_has_its_permission():
    missing = sorted(answered_methods() - set(API_PERMISSIONS["methods"]))
    assert missing == [], f"add these to catalog/api_permissions.yaml, with their source: {missing}"


def test_every_permission_the_callers_methods_need_is_checked():
    needed = {API_PERMISSIONS["methods"][method] for method in answered_methods()} - {""}
    unchecked = sorted(needed - checked_caller_permissions())
    assert unchecked == [], f"preflight --access checks none of these for the caller: {unchecked}"


def test_the_ledger_fails_when_the_catalog_stops_checking_a_permission():
    needed = {API_PERMISSIONS["methods"][method] for method in answered_methods()} - {""}
    assert "dataflow.jobs.create" in needed - (checked_caller_permissions() - {"dataflow.jobs.create"})
