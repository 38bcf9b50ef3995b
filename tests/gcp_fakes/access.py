"""What preflight's access check reads of a project, faked at the client boundary.

One fake per Google service (Service Usage, Resource Manager, IAM, Organization Policy, Compute Engine's
subnetworks), each a ``mock.create_autospec`` of the real GAPIC client class: a method the real client lacks
fails, one it has but the fake does not answer fails, and every request is turned into the API's own request type
and checked, as the real client would. They answer from one project's state (``FakeProjectAccess``), whose default
is a project in order: every API on, every permission held, the workers' accounts with their roles.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

from google.api_core import exceptions
from google.cloud import compute_v1, iam_admin_v1, orgpolicy_v2, resourcemanager_v3, service_usage_v1
from google.cloud import storage as cloud_storage
from google.iam.v1 import iam_policy_pb2, policy_pb2

from tests.helpers import GCP_TEST_PROJECT

#: The roles a worker service account of a project in order holds there.
#: The roles docs/gcp.md's step 4 grants the workers' account.
WORKER_ROLES = frozenset({"roles/dataflow.worker", "roles/artifactregistry.reader", "roles/storage.objectAdmin",
                          "roles/pubsub.subscriber", "roles/pubsub.publisher"})
PROJECT_NUMBER = "123456789012"
COMPUTE_DEFAULT_ACCOUNT = f"{PROJECT_NUMBER}-compute@developer.gserviceaccount.com"
TEST_WORKER_ACCOUNT = f"sa@{GCP_TEST_PROJECT}.iam.gserviceaccount.com"
#: The legacy Cloud Build service account, with the role Cloud Build grants it (its default in the fakes).
LEGACY_BUILD_ACCOUNT = f"{PROJECT_NUMBER}@cloudbuild.gserviceaccount.com"
BUILDER_ROLE = "roles/cloudbuild.builds.builder"


def autospec_client(real_class: type, answers: dict[str, Any]):
    """The real client class's autospec: ``answers`` answer their methods; any other method of it fails."""
    client = mock.create_autospec(real_class, instance=True)
    for name, _ in inspect.getmembers(real_class, inspect.isfunction):
        if name.startswith("_") or name.endswith("_path") or name.startswith("parse_"):
            continue
        unanswered = AssertionError(f"{real_class.__name__}.{name} is not what preflight's access check calls")
        getattr(client, name).side_effect = answers.get(name, unanswered)
    missing = [name for name in answers if not callable(getattr(real_class, name, None))]
    assert not missing, f"{real_class.__name__} has no {missing}"
    return client


def as_api_type(request_type: type, request: Any) -> Any:
    """A dict request as the real client makes it: the API's own type (proto-plus takes the dict, a plain protobuf
    message such as google.iam.v1's takes its fields); anything else as it came."""
    if not isinstance(request, dict):
        return request
    return request_type(**request) if hasattr(request_type, "DESCRIPTOR") else request_type(request)


def _typed(request_type: type, request: Any) -> Any:
    """The request as the API's own type; any other type fails."""
    request = as_api_type(request_type, request)
    assert isinstance(request, request_type), f"expected {request_type.__name__}, got {type(request).__name__}"
    return request


@dataclass
class FakeProjectAccess:
    """One project as Google's control planes would answer about it."""

    number: str = PROJECT_NUMBER  # of whichever project is asked about
    disabled: set[str] = field(default_factory=set)  # APIs not enabled
    denied: set[str] = field(default_factory=set)  # project permissions the caller lacks
    # service account -> its roles on the project; an account not here does not exist
    accounts: dict[str, set[str]] = field(default_factory=lambda: {
        COMPUTE_DEFAULT_ACCOUNT: set(WORKER_ROLES), TEST_WORKER_ACCOUNT: set(WORKER_ROLES),
        LEGACY_BUILD_ACCOUNT: {BUILDER_ROLE}})
    act_as_denied: set[str] = field(default_factory=set)  # accounts the caller may not act as
    policy_readable: bool = True  # the caller may read the project's IAM policy
    project_readable: bool = True  # the caller may see the project at all (a 403 on it: a mistyped id, or no role)
    org_policies: dict[str, orgpolicy_v2.Policy] = field(default_factory=dict)  # by constraint name
    unreadable_policies: set[str] = field(default_factory=set)  # constraint names whose read is refused
    subnetworks: dict[str, bool] = field(default_factory=dict)  # subnetwork name -> Private Google Access
    requests: list[Any] = field(default_factory=list)
    _clients: dict[type, Any] = field(default_factory=dict, repr=False)

    # -- Service Usage --------------------------------------------------------------------------

    def batch_get_services(self, request=None, **_options):
        request = _typed(service_usage_v1.BatchGetServicesRequest, request)
        self.requests.append(request)
        assert re.fullmatch(r"projects/[^/]+", request.parent), request.parent
        assert 0 < len(request.names) <= 30, "services:batchGet takes 1 to 30 names"
        state = service_usage_v1.State
        return service_usage_v1.BatchGetServicesResponse(services=[
            service_usage_v1.Service(name=name, parent=request.parent, state=state.DISABLED
                                     if name.rsplit("/", 1)[1] in self.disabled else state.ENABLED)
            for name in request.names])

    # -- Resource Manager ----------------------------------------------------------------------

    def get_project(self, request=None, **_options):
        request = _typed(resourcemanager_v3.GetProjectRequest, request)
        self.requests.append(request)
        assert re.fullmatch(r"projects/[a-z][-a-z0-9]+", request.name), request.name
        if not self.project_readable:
            raise exceptions.PermissionDenied(f"The caller does not have permission on {request.name}")
        return resourcemanager_v3.Project(name=f"projects/{self.number}", project_id=request.name.split("/")[1])

    def test_project_permissions(self, request=None, **_options):
        request = _typed(iam_policy_pb2.TestIamPermissionsRequest, request)
        self.requests.append(request)
        assert re.fullmatch(r"projects/[a-z][-a-z0-9]+", request.resource), request.resource
        assert 0 < len(request.permissions) <= 100 and not any("*" in p for p in request.permissions)
        return iam_policy_pb2.TestIamPermissionsResponse(
            permissions=[permission for permission in request.permissions if permission not in self.denied])

    def get_project_policy(self, request=None, **_options):
        request = _typed(iam_policy_pb2.GetIamPolicyRequest, request)
        self.requests.append(request)
        if not self.policy_readable:
            raise exceptions.PermissionDenied("Permission 'resourcemanager.projects.getIamPolicy' denied")
        roles = sorted({role for held in self.accounts.values() for role in held})
        return policy_pb2.Policy(bindings=[
            policy_pb2.Binding(role=role, members=[f"serviceAccount:{account}" for account, held
                                                   in sorted(self.accounts.items()) if role in held])
            for role in roles])

    # -- IAM ----------------------------------------------------------------------------------

    def _account(self, resource: str) -> str:
        assert resource.startswith("projects/-/serviceAccounts/"), resource
        email = resource.rsplit("/", 1)[1]
        if email not in self.accounts:
            raise exceptions.NotFound(f"Service account {email} does not exist.")
        return email

    def get_service_account(self, request=None, **_options):
        request = _typed(iam_admin_v1.GetServiceAccountRequest, request)
        self.requests.append(request)
        email = self._account(request.name)
        return iam_admin_v1.ServiceAccount(name=f"projects/-/serviceAccounts/{email}", email=email)

    def test_account_permissions(self, request=None, **_options):
        request = _typed(iam_policy_pb2.TestIamPermissionsRequest, request)
        self.requests.append(request)
        email = self._account(request.resource)
        denied = {"iam.serviceAccounts.actAs"} if email in self.act_as_denied else set()
        return iam_policy_pb2.TestIamPermissionsResponse(
            permissions=[permission for permission in request.permissions if permission not in denied])

    # -- Organization Policy --------------------------------------------------------------------

    def get_effective_policy(self, request=None, **_options):
        request = _typed(orgpolicy_v2.GetEffectivePolicyRequest, request)
        self.requests.append(request)
        found = re.fullmatch(r"projects/[a-z][-a-z0-9]+/policies/(?P<constraint>[a-zA-Z.]+)", request.name)
        assert found, request.name
        constraint = found["constraint"]
        if constraint in self.unreadable_policies:
            raise exceptions.PermissionDenied(f"Permission 'orgpolicy.policy.get' denied on {request.name}")
        return self.org_policies.get(constraint, orgpolicy_v2.Policy(name=request.name))

    # -- Compute Engine subnetworks ---------------------------------------------------------------

    def get_subnetwork(self, request=None, **_options):
        request = _typed(compute_v1.GetSubnetworkRequest, request)
        self.requests.append(request)
        if request.subnetwork not in self.subnetworks:
            raise exceptions.NotFound(f"The resource 'subnetworks/{request.subnetwork}' was not found")
        return compute_v1.Subnetwork(name=request.subnetwork, region=request.region,
                                     private_ip_google_access=self.subnetworks[request.subnetwork])

    # -- the clients ------------------------------------------------------------------------------

    def client(self, real_class: type) -> Any:
        """The autospec fake of one real client class (one per Google service), made once per project."""
        if real_class not in self._clients:
            self._clients[real_class] = autospec_client(real_class, self._answers()[real_class.__name__])
        return self._clients[real_class]

    def _answers(self) -> dict[str, dict[str, Any]]:
        return {
            "ServiceUsageClient": {"batch_get_services": self.batch_get_services},
            "ProjectsClient": {"get_project": self.get_project, "test_iam_permissions": self.test_project_permissions,
                               "get_iam_policy": self.get_project_policy},
            "IAMClient": {"get_service_account": self.get_service_account,
                          "test_iam_permissions": self.test_account_permissions},
            "OrgPolicyClient": {"get_effective_policy": self.get_effective_policy},
            "SubnetworksClient": {"get": self.get_subnetwork},
        }


#: The real client classes, held before a test puts the fakes' factories in their place.
ACCESS_CLIENTS = (service_usage_v1.ServiceUsageClient, resourcemanager_v3.ProjectsClient, iam_admin_v1.IAMClient,
                  orgpolicy_v2.OrgPolicyClient, compute_v1.SubnetworksClient)


def list_policy(constraint: str, *, allow_all: bool = False, deny_all: bool = False, allowed: tuple[str, ...] = (),
                denied: tuple[str, ...] = ()) -> orgpolicy_v2.Policy:
    """An effective list policy with one rule, as the Org Policy API answers it."""
    Rule = orgpolicy_v2.PolicySpec.PolicyRule
    if allow_all or deny_all:
        rule = Rule(allow_all=allow_all) if allow_all else Rule(deny_all=True)
    else:
        rule = Rule(values=Rule.StringValues(allowed_values=list(allowed), denied_values=list(denied)))
    return orgpolicy_v2.Policy(name=f"projects/{GCP_TEST_PROJECT}/policies/{constraint}",
                               spec=orgpolicy_v2.PolicySpec(rules=[rule]))


@dataclass
class FakeStorageAccess:
    """Cloud Storage's buckets as the access check reads them: ``google.cloud.storage.Client`` and ``Bucket``
    autospecs. (The DAG tests use the GCS emulator instead, which answers the same calls.)"""

    buckets: dict[str, str] = field(default_factory=dict)  # name -> location, as Cloud Storage spells it
    denied: set[str] = field(default_factory=set)  # bucket permissions the caller lacks
    bindings: dict[str, list[str]] = field(default_factory=dict)  # role -> members, on every bucket
    _client: Any = field(default=None, repr=False)

    def _bucket(self, name: str):
        bucket = mock.create_autospec(cloud_storage.Bucket, instance=True)
        bucket.name = name
        bucket.location = self.buckets.get(name, "")
        bucket.location_type = "region"

        def test_iam_permissions(permissions, **_options):
            assert all("*" not in permission for permission in permissions)
            return [permission for permission in permissions if permission not in self.denied]

        def get_iam_policy(requested_policy_version=None, **_options):
            from google.api_core.iam import Policy

            policy = Policy(version=requested_policy_version or 1)
            policy.bindings = [{"role": role, "members": set(members)} for role, members in self.bindings.items()]
            return policy

        bucket.test_iam_permissions.side_effect = test_iam_permissions
        bucket.get_iam_policy.side_effect = get_iam_policy
        return bucket

    def client(self):
        if self._client is None:
            self._client = autospec_client(STORAGE_CLIENT, {
                "lookup_bucket": lambda name, **_options: self._bucket(name) if name in self.buckets else None,
                "bucket": lambda name, **_options: self._bucket(name)})
        return self._client

    def install(self, monkeypatch) -> FakeStorageAccess:
        """In place of the storage.Client that the provider's GCSHook makes."""
        def make(**kwargs):
            assert kwargs.get("credentials") is not None, "storage.Client made without credentials"
            return self.client()

        monkeypatch.setattr(cloud_storage, "Client", make)
        return self


STORAGE_CLIENT = cloud_storage.Client
