"""Preflight's access check on gcp, through the real probe and clients, with Google's services faked at the client
boundary (tests/gcp_fakes/access.py). Each finding's fix, applied to the fake project as written, clears it."""

import json
import re

import pytest
from google.cloud import service_usage_v1
from google.iam.v1 import iam_policy_pb2

from gpuflow.catalog import access_needs
from gpuflow.platform.gcp import GcpPlatform
from gpuflow.preflight import has_errors
from gpuflow.preflight.access_rules import WORKFLOW_NEEDS, access_findings
from tests.gcp_fakes import FakeGoogleCloud, FakeStorageAccess, gcp_test_config, list_policy
from tests.gcp_fakes.access import COMPUTE_DEFAULT_ACCOUNT, TEST_WORKER_ACCOUNT
from tests.helpers import GCP_TEST_PROJECT

BUCKET = "gpuflow-access-test"


@pytest.fixture
def cloud(monkeypatch):
    return FakeGoogleCloud().install(monkeypatch)


@pytest.fixture
def storage(monkeypatch):
    return FakeStorageAccess({BUCKET: "US-CENTRAL1"}).install(monkeypatch)


def findings(*overrides, workflow="inference"):
    config = gcp_test_config(f"bucket={BUCKET}", *overrides)
    return access_findings(config, workflow, GcpPlatform(config).access_probe())


def check(*overrides, workflow="inference"):
    """The findings that ask for something: the info ones only name who does what."""
    return [finding for finding in findings(*overrides, workflow=workflow) if finding.level != "info"]


def only(findings, field=None, level=None):
    found = [f for f in findings if (field is None or f.field == field) and (level is None or f.level == level)]
    assert len(found) == 1, found
    return found[0]


def test_a_project_in_order_has_no_findings_and_each_service_was_asked_with_its_own_types(cloud, storage):
    assert check() == []
    kinds = {type(request).__name__ for request in cloud.access.requests}
    assert {"BatchGetServicesRequest", "TestIamPermissionsRequest", "GetServiceAccountRequest",
            "GetIamPolicyRequest", "GetEffectivePolicyRequest", "GetProjectRequest"} <= kinds
    made = {name for name, _ in cloud.clients_made}
    assert {"ServiceUsageClient", "ProjectsClient", "IAMClient", "OrgPolicyClient"} <= made


def test_a_new_project_with_its_apis_off_gets_one_enable_line_naming_exactly_the_missing_ones(cloud, storage):
    wanted = {api for name in WORKFLOW_NEEDS["inference"] for api in access_needs()[name].apis}
    cloud.access.disabled = {"dataflow.googleapis.com", "aiplatform.googleapis.com", "cloudquotas.googleapis.com"}
    finding = only(check(), level="error")
    named = set(re.search(r"gcloud services enable (.*) --project", finding.fix).group(1).split())
    assert named == cloud.access.disabled and named <= wanted
    cloud.access.disabled -= named  # what the fix does
    assert check() == []


def test_the_batch_get_asks_at_most_30_services_by_the_project_number(cloud, storage):
    check()
    batch = [r for r in cloud.access.requests if isinstance(r, service_usage_v1.BatchGetServicesRequest)]
    assert batch and all(r.parent == "projects/123456789012" and len(r.names) <= 30 for r in batch)


def test_too_few_permissions_lists_exactly_the_missing_ones_with_the_roles_that_grant_them(cloud, storage):
    cloud.access.denied = {"dataflow.jobs.updateContents", "pubsub.topics.create", "monitoring.timeSeries.list"}
    finding = only(check(), field="gcp_conn_id")
    assert finding.level == "error"
    for permission in cloud.access.denied:
        assert permission in finding.problem
    grants = re.findall(r"add-iam-policy-binding \S+ --member=\S+ --role=([^\s;]+)", finding.fix)
    assert sorted(grants) == ["roles/dataflow.developer", "roles/monitoring.viewer", "roles/pubsub.editor"]
    granted = {p for role in grants for need in access_needs().values() for p, r in need.permissions.items()
               if r == role}
    cloud.access.denied -= granted  # granting those roles
    assert check() == []


@pytest.mark.parametrize(("workflow", "asked", "not_asked"), [
    ("quota_report", {"compute.regions.get", "cloudquotas.quotas.get"}, {"dataflow.jobs.create", "pubsub.topics.create"}),
    ("dataproc", {"dataproc.batches.create", "storage.objects.create"}, {"dataflow.jobs.create", "cloudbuild.builds.create"}),
    ("maintenance", {"dataflow.jobs.cancel", "pubsub.topics.delete"}, {"aiplatform.customJobs.create"}),
])
def test_a_workflow_asks_only_for_its_own_steps_permissions(cloud, storage, workflow, asked, not_asked):
    check(workflow=workflow)
    tested = {permission for request in cloud.access.requests
              if isinstance(request, iam_policy_pb2.TestIamPermissionsRequest)
              and request.resource == f"projects/{GCP_TEST_PROJECT}" for permission in request.permissions}
    assert asked <= tested and not (not_asked & tested)


def test_a_worker_account_the_caller_may_not_act_as_is_an_error_whose_grant_clears_it(cloud, storage):
    cloud.access.act_as_denied = {COMPUTE_DEFAULT_ACCOUNT}
    finding = only(check(), field="dataflow.service_account")
    assert finding.level == "error" and "iam.serviceAccounts.actAs" in finding.problem
    assert f"gcloud iam service-accounts add-iam-policy-binding {COMPUTE_DEFAULT_ACCOUNT}" in finding.fix
    assert "--role=roles/iam.serviceAccountUser" in finding.fix
    cloud.access.act_as_denied = set()
    assert check() == []


def test_a_worker_account_without_the_worker_role_is_an_error_whose_grant_clears_it(cloud, storage):
    cloud.access.accounts[TEST_WORKER_ACCOUNT].discard("roles/dataflow.worker")
    finding = only(check(f"dataflow.service_account={TEST_WORKER_ACCOUNT}"), field="dataflow.service_account")
    assert finding.level == "error" and "roles/dataflow.worker" in finding.problem
    assert finding.fix == (f"gcloud projects add-iam-policy-binding {GCP_TEST_PROJECT} "
                           f"--member=serviceAccount:{TEST_WORKER_ACCOUNT} --role=roles/dataflow.worker")
    cloud.access.accounts[TEST_WORKER_ACCOUNT].add("roles/dataflow.worker")
    assert check(f"dataflow.service_account={TEST_WORKER_ACCOUNT}") == []


def test_a_worker_account_may_pull_the_image_through_the_repositorys_own_binding(cloud, storage):
    cloud.access.accounts[COMPUTE_DEFAULT_ACCOUNT].discard("roles/artifactregistry.reader")
    finding = only(check(), field="dataflow.service_account")
    assert finding.level == "error"
    assert finding.fix.startswith("gcloud artifacts repositories add-iam-policy-binding gpuflow --location=us-central1")
    cloud.registry.repository_bindings["roles/artifactregistry.reader"] = [f"serviceAccount:{COMPUTE_DEFAULT_ACCOUNT}"]
    assert check() == []


def test_a_worker_account_that_does_not_exist_is_an_error(cloud, storage):
    finding = only(check("dataflow.service_account=gone@gpuflow-gcp-test.iam.gserviceaccount.com"))
    assert finding.level == "error" and "does not exist" in finding.problem


def test_an_unreadable_iam_policy_is_unknown_with_the_command_that_would_tell(cloud, storage):
    cloud.access.policy_readable = False
    found = check()  # the workers' roles and Cloud Build's account's roles are read from that policy
    assert {finding.field for finding in found} == {"dataflow.service_account", "container.repository"}
    assert all(finding.level == "unknown" for finding in found) and not has_errors(found)
    assert all(finding.fix.startswith(f"gcloud projects get-iam-policy {GCP_TEST_PROJECT}") for finding in found)


@pytest.mark.parametrize("policy", [{"deny_all": True}, {"allowed": ("projects/x/zones/z/instances/bastion",)}])
def test_a_policy_forbidding_external_ips_wants_private_workers_on_a_subnetwork_with_private_google_access(
        cloud, storage, policy):
    cloud.access.org_policies["compute.vmExternalIpAccess"] = list_policy("compute.vmExternalIpAccess", **policy)
    finding = only(check(), field="dataflow.use_public_ips")
    assert finding.level == "error" and "dataflow.use_public_ips: false" in finding.fix
    finding = only(check("dataflow.use_public_ips=false"), field="dataflow.subnetwork")
    assert finding.level == "error" and "Private Google Access" in finding.fix
    subnet = "regions/us-central1/subnetworks/workers"
    cloud.access.subnetworks["workers"] = False
    finding = only(check("dataflow.use_public_ips=false", f"dataflow.subnetwork={subnet}"))
    # a warning, not an error: Private Service Connect is Google's other documented route
    assert finding.level == "warning" and "Private Service Connect" in finding.problem
    assert "--enable-private-ip-google-access" in finding.fix
    cloud.access.subnetworks["workers"] = True  # what the fix does
    assert check("dataflow.use_public_ips=false", f"dataflow.subnetwork={subnet}") == []


def test_external_ips_allowed_to_all_need_nothing(cloud, storage):
    cloud.access.org_policies["compute.vmExternalIpAccess"] = list_policy("compute.vmExternalIpAccess", allow_all=True)
    assert check() == []


def test_an_unreadable_policy_is_unknown_never_an_error(cloud, storage):
    cloud.access.unreadable_policies = {"compute.vmExternalIpAccess", "gcp.resourceLocations"}
    findings = check()
    assert findings and {f.level for f in findings} == {"unknown"}
    assert all("gcloud org-policies describe" in f.fix for f in findings)


@pytest.mark.parametrize(("allowed", "level"), [
    (("in:europe-west4-locations",), "error"),
    (("in:us-locations",), "unknown"),  # a value group gpuflow does not expand
    (("in:us-central1-locations",), None),
    (("us-central1",), None),
])
def test_the_locations_policy_judges_the_region(cloud, storage, allowed, level):
    cloud.access.org_policies["gcp.resourceLocations"] = list_policy("gcp.resourceLocations", allowed=allowed)
    findings = check()
    assert [f.level for f in findings] == ([level] if level else [])
    assert all(f.field == "region" for f in findings)


def test_a_bucket_that_is_missing_far_away_or_closed_is_said(cloud, monkeypatch):
    storage = FakeStorageAccess({}).install(monkeypatch)
    finding = only(findings(), field="bucket")  # setup creates a configured bucket that is missing, and keeps it
    assert finding.field == "bucket" and finding.level == "info"
    assert f"gcloud storage buckets create gs://{BUCKET}" in finding.fix
    storage.buckets[BUCKET] = "EUROPE-WEST4"
    assert only(check()).level == "warning"
    storage.buckets[BUCKET] = "US-CENTRAL1"
    storage.denied = {"storage.objects.delete"}
    finding = only(check())
    assert finding.level == "error" and "storage.objects.delete" in finding.problem
    assert f"gcloud storage buckets add-iam-policy-binding gs://{BUCKET}" in finding.fix


def test_the_worker_account_may_use_the_bucket_through_its_own_binding(cloud, monkeypatch):
    cloud.access.accounts[COMPUTE_DEFAULT_ACCOUNT].discard("roles/storage.objectAdmin")
    storage = FakeStorageAccess({BUCKET: "US-CENTRAL1"}).install(monkeypatch)
    finding = only(check())
    assert finding.field == "dataflow.service_account" and f"gs://{BUCKET}" in finding.fix
    storage.bindings["roles/storage.objectAdmin"] = [f"serviceAccount:{COMPUTE_DEFAULT_ACCOUNT}"]
    assert check() == []


def test_the_caller_named_in_fixes_is_the_impersonated_account(cloud, monkeypatch):
    import json

    chain = "deployer@gpuflow-gcp-test.iam.gserviceaccount.com"
    monkeypatch.setenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", json.dumps({"conn_type": "google_cloud_platform", "extra": {
        "is_anonymous": True, "project": GCP_TEST_PROJECT, "impersonation_chain": chain}}))
    probe = GcpPlatform(gcp_test_config()).access_probe()
    assert probe.caller() == f"serviceAccount:{chain}"


def test_a_private_worker_job_says_so_in_its_request():
    from gpuflow.dataflow.options import dataflow_options, worker_pool_fields
    from gpuflow.runs.naming import resource_names

    config = gcp_test_config("dataflow.use_public_ips=false")
    names = resource_names(config, "run-1")
    assert worker_pool_fields(config, names, streaming=True)["ip_configuration"] == "WORKER_IP_PRIVATE"
    assert "--no_use_public_ips" in dataflow_options(config, names, "image:tag", "job", streaming=True, template_uri=None)


def test_preflight_access_from_a_shell_reads_google_and_fails_on_a_missing_api(cloud, storage, capsys):
    from gpuflow.tools.cli import main

    cloud.access.disabled = {"dataflow.googleapis.com"}
    args = ["preflight", "--access", "--config-only", "--config", "configs/gcp.example.yaml", "--json",
            "--set", f"project={GCP_TEST_PROJECT}", "--set", f"bucket={BUCKET}"]
    assert main(args) == 1
    report = json.loads(capsys.readouterr().out)
    (enable,) = [f for f in report["findings"] if f["fix"].startswith("gcloud services enable")]
    assert enable["fix"] == f"gcloud services enable dataflow.googleapis.com --project={GCP_TEST_PROJECT}"
    cloud.access.disabled = set()
    assert main(args) == 0


def test_preflight_access_on_the_local_profile_says_there_is_nothing_to_read(capsys):
    from gpuflow.tools.cli import main

    assert main(["preflight", "--access", "--config-only"]) == 0
    assert "no Google Cloud project to check" in capsys.readouterr().err



# -- every identity a run uses, named; Cloud Build's account and the check's own APIs -----------------------------


def test_the_check_names_every_identity_a_run_uses(cloud, storage):
    named = {finding.field: finding.problem for finding in findings() if finding.level == "info"}
    assert "builds run as 123456789012@cloudbuild.gserviceaccount.com" in named["container.repository"]
    assert "the Vertex AI export runs as Vertex AI's default identity" in named["dataflow.service_account"]
    named = {f.field: f.problem for f in findings(f"dataflow.service_account={TEST_WORKER_ACCOUNT}") if f.level == "info"}
    assert f"the Vertex AI export runs as {TEST_WORKER_ACCOUNT}" in named["dataflow.service_account"]
    asked = [request for name, request in cloud.build.requests if name == "get_default_service_account"]
    assert [r.name for r in asked] == [f"projects/{GCP_TEST_PROJECT}/locations/us-central1/defaultServiceAccount"] * 2


def test_builds_as_the_compute_default_account_without_a_log_writer_role_are_refused_with_the_grants(cloud, storage):
    """A project whose organization settings build as the Compute Engine default account (since 2024): that account
    has the workers' roles, not a build's."""
    cloud.build.default_account = COMPUTE_DEFAULT_ACCOUNT
    finding = only(check(), field="container.repository")
    assert finding.level == "error" and f"builds run as {COMPUTE_DEFAULT_ACCOUNT}" in finding.problem
    assert "roles/logging.logWriter: write the build's logs (CLOUD_LOGGING_ONLY)" in finding.problem
    granted = re.findall(rf"gcloud projects add-iam-policy-binding {GCP_TEST_PROJECT} "
                         rf"--member=serviceAccount:{re.escape(COMPUTE_DEFAULT_ACCOUNT)} --role=([^\s;]+)", finding.fix)
    assert set(granted) == {"roles/logging.logWriter", "roles/storage.objectViewer", "roles/artifactregistry.writer"}
    cloud.access.accounts[COMPUTE_DEFAULT_ACCOUNT] |= set(granted)  # what the fix does
    assert check() == []


def test_the_export_identity_without_act_as_is_named_in_the_finding(cloud, storage):
    cloud.access.act_as_denied = {TEST_WORKER_ACCOUNT}
    finding = only(check(f"dataflow.service_account={TEST_WORKER_ACCOUNT}"), field="dataflow.service_account")
    assert finding.level == "error" and "the Vertex AI export" in finding.problem
    assert f"gcloud iam service-accounts add-iam-policy-binding {TEST_WORKER_ACCOUNT}" in finding.fix
    cloud.access.act_as_denied = set()  # what the fix does
    assert check(f"dataflow.service_account={TEST_WORKER_ACCOUNT}") == []


def test_the_apis_the_check_itself_reads_with_are_asked_for_too(cloud, storage):
    cloud.access.disabled = {"iam.googleapis.com", "orgpolicy.googleapis.com"}
    finding = only(check(), level="error")
    assert "read what this access check reads" in finding.problem
    assert finding.fix == f"gcloud services enable iam.googleapis.com orgpolicy.googleapis.com --project={GCP_TEST_PROJECT}"
    cloud.access.disabled = set()
    assert check() == []


def test_preflight_access_that_reads_nothing_fails_as_not_checked_unless_accepted(cloud, storage, capsys):
    from gpuflow.tools.cli import main

    args = ["preflight", "--access", "--config-only", "--config", "configs/gcp.example.yaml",
            "--set", f"project={GCP_TEST_PROJECT}", "--set", f"bucket={BUCKET}"]
    cloud.access.policy_readable = False  # rows that need the project's IAM policy cannot be read
    assert main(args) == 1
    out = capsys.readouterr()
    assert "preflight: not checked: " in out.out and "--accept-unknown" in out.err
    assert main([*args, "--accept-unknown"]) == 0
    assert "(accepted: --accept-unknown)" in capsys.readouterr().out


def test_preflight_access_on_a_project_google_will_not_show_names_it_and_stops(cloud, storage, capsys):
    from gpuflow.tools.cli import main

    cloud.access.project_readable = False  # a mistyped project id, or no role on it: a 403
    assert main(["preflight", "--access", "--config-only", "--config", "configs/gcp.example.yaml",
                 "--set", "project=acme-typo-prod", "--set", f"bucket={BUCKET}"]) == 1
    err = capsys.readouterr().err
    assert "Google refused to show project acme-typo-prod: it may not exist, or this identity may lack access" in err
    assert "gcloud projects describe acme-typo-prod" in err


@pytest.mark.parametrize("missing", ["roles/pubsub.subscriber", "roles/pubsub.publisher"])
def test_a_streaming_worker_account_without_its_pubsub_role_is_refused_with_the_grant(cloud, storage, missing):
    """The streaming job pulls prompts and publishes answers as the workers' account (guide 002, step 18)."""
    from tests.gcp_fakes.access import COMPUTE_DEFAULT_ACCOUNT

    cloud.access.accounts[COMPUTE_DEFAULT_ACCOUNT].discard(missing)
    config = gcp_test_config(f"bucket={BUCKET}")
    probe = GcpPlatform(config).access_probe()
    refused = [f for f in access_findings(config, "inference", probe) if f.level == "error"]
    assert [f.fix.rsplit("--role=", 1)[1] for f in refused] == [missing], refused
    assert "the streaming job would answer nothing" in refused[0].problem
    # the batch job reads and writes files, not Pub/Sub
    assert not [f for f in access_findings(config, "batch", GcpPlatform(config).access_probe()) if f.level == "error"]


def test_preflight_access_checks_another_identity_by_impersonation(cloud, storage, capsys):
    """From a shell, as the identity the DAGs run as (a Composer environment's account): the check names it as the
    caller, and asks Google as it (the fakes answer the caller's permissions whoever it is)."""
    from gpuflow.tools.cli import main

    environment_account = f"composer-env@{GCP_TEST_PROJECT}.iam.gserviceaccount.com"
    cloud.access.denied = {"dataflow.jobs.create"}
    assert main(["preflight", "--access", "--config-only", "--config", "configs/gcp.example.yaml", "--json",
                 "--set", f"project={GCP_TEST_PROJECT}", "--set", f"bucket={BUCKET}",
                 "--impersonate", environment_account]) == 1
    report = json.loads(capsys.readouterr().out)
    (lacking,) = [f for f in report["findings"] if f["field"] == "gcp_conn_id" and f["level"] == "error"]
    assert f"serviceAccount:{environment_account} lacks" in lacking["problem"]
    assert f"--member=serviceAccount:{environment_account}" in lacking["fix"]
