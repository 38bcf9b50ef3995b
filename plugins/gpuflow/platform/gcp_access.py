"""The gcp profile's ``AccessProbe``: reads what preflight's access rules judge, with Google's own clients.

Service Usage (``services:batchGet``), Resource Manager (the project's number, IAM policy and
``testIamPermissions``), IAM (the service account and ``testIamPermissions`` on it), Organization Policy (effective
policies), Compute Engine (a subnetwork's Private Google Access) and Cloud Storage, through the provider's
``GCSHook``. The clients are built from the Airflow connection (``GcpClients``), so the caller is the connection's
identity after impersonation. A read that is refused (403) or fails becomes ``AccessUnknown``, with the command that
would tell. apache-airflow-providers-google 22.8.0 has no hook for Service Usage, Resource Manager, IAM or
Organization Policy (none of its ``cloud/hooks`` modules makes their clients), and its ``ComputeEngineHook`` has no
subnetwork method, so those clients are made in ``GcpClients``, with ``GoogleBaseHook``'s credentials.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Iterator
from typing import Any, Literal, TypeVar, overload

from gpuflow.platform.access_facts import AccessUnknown, BucketFacts, EffectivePolicy, describe_policy

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Service Usage's services:batchGet "can get a maximum of 30 services at a time" (its BatchGetServicesRequest.names).
BATCH_GET_MAX = 30
#: The permissions gpuflow asks about in one testIamPermissions call: gpuflow's own chunk size (Resource Manager's
#: projects.testIamPermissions page states no limit; the workflows ask for fewer than this anyway).
TEST_PERMISSIONS_MAX = 100


def _chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


class GcpAccessProbe:
    """One project's facts, read on demand and each read once."""

    def __init__(self, project: str, region: str, clients: Any):
        self.project, self.region, self.clients = project, region, clients

    @overload
    def _read(self, what: str, command: str, read: Callable[[], T], absent_ok: Literal[False] = False) -> T: ...

    @overload
    def _read(self, what: str, command: str, read: Callable[[], T], absent_ok: Literal[True]) -> T | None: ...

    def _read(self, what: str, command: str, read: Callable[[], T], absent_ok: bool = False) -> T | None:
        """``read()``; a refusal or failure becomes AccessUnknown. Where ``absent_ok``, a 404 is the answer: None."""
        from google.api_core import exceptions
        from google.auth import exceptions as auth_exceptions

        try:
            return read()
        except exceptions.NotFound:
            if absent_ok:
                return None
            raise AccessUnknown(f"{what}: not found", command) from None
        except (exceptions.PermissionDenied, exceptions.Forbidden, exceptions.Unauthenticated) as problem:
            raise AccessUnknown(f"{what} was refused ({problem.message})", command) from None
        except exceptions.GoogleAPICallError as problem:
            raise AccessUnknown(f"{what} failed ({problem.__class__.__name__}: {problem.message})", command) from None
        except (exceptions.RetryError, auth_exceptions.GoogleAuthError) as problem:  # unreachable, or no credentials
            raise AccessUnknown(f"{what} failed ({problem.__class__.__name__}: {problem})", command) from None

    @functools.cache  # noqa: B019 - one probe per preflight, dropped with it
    def _client(self, kind: str) -> Any:
        """One client of each kind per probe (``GcpClients.<kind>()``): its credentials are looked up once."""
        return getattr(self.clients, kind)()

    @functools.cache  # noqa: B019
    def caller(self) -> str | None:
        email = self.clients.caller_email()
        if not email:
            return None
        return f"serviceAccount:{email}" if email.endswith(".gserviceaccount.com") else f"user:{email}"

    def first_contact(self, timeout_s: float = 10) -> str | None:
        """One read of the project, without retries and within ``timeout_s``, before the probe's many reads (whose
        clients retry for minutes): why nothing can be checked, with its fix; None when Google answered."""
        from google.api_core import exceptions
        from google.auth import exceptions as auth_exceptions

        try:
            self._client("projects").get_project(request={"name": f"projects/{self.project}"}, retry=None,
                                                 timeout=timeout_s)
        except (exceptions.PermissionDenied, exceptions.Forbidden):
            return (f"Google refused to show project {self.project}: it may not exist, or this identity may lack "
                    f"access to it. Fix: check the project id (`gcloud projects describe {self.project}`), and that "
                    "the identity the check runs as has a role on it (docs/gcp.md)")
        except exceptions.NotFound:
            return (f"project {self.project} does not exist. Fix: set project to your project's id "
                    "(`gcloud projects list`)")
        except (exceptions.GoogleAPICallError, exceptions.RetryError, auth_exceptions.TransportError,
                OSError) as problem:
            return (f"Google could not be reached ({type(problem).__name__}), so nothing could be checked. Fix: "
                    "check this machine's network (DNS, proxy, firewall), then run the check again")
        return None

    @functools.cache  # noqa: B019 - one probe per preflight, dropped with it
    def project_number(self) -> str:
        project = self._read(f"reading project {self.project}", f"gcloud projects describe {self.project} "
                             "--format='value(projectNumber)'",
                             lambda: self._client("projects").get_project(request={"name": f"projects/{self.project}"}))
        return str(project.name).split("/", 1)[1]

    def disabled_services(self, services: list[str]) -> list[str]:
        try:
            parent = f"projects/{self.project_number()}"
        except AccessUnknown:  # Service Usage also takes the project's id
            parent = f"projects/{self.project}"
        from google.cloud.service_usage_v1 import State

        client = self._client("service_usage")
        enabled: set[str] = set()
        for chunk in _chunks(services, BATCH_GET_MAX):
            response = self._read(
                "reading which APIs are enabled", f"gcloud services list --enabled --project={self.project}",
                functools.partial(client.batch_get_services, request={
                    "parent": parent, "names": [f"{parent}/services/{service}" for service in chunk]}))
            enabled |= {service.name.rsplit("/", 1)[1] for service in response.services
                        if service.state == State.ENABLED}
        return [service for service in services if service not in enabled]

    def missing_project_permissions(self, permissions: list[str]) -> list[str]:
        client = self._client("projects")
        granted: set[str] = set()
        for chunk in _chunks(permissions, TEST_PERMISSIONS_MAX):
            response = self._read(
                f"testing permissions on {self.project}", f"gcloud projects get-iam-policy {self.project}",
                functools.partial(client.test_iam_permissions, request={
                    "resource": f"projects/{self.project}", "permissions": chunk}))
            granted |= set(response.permissions)
        return [permission for permission in permissions if permission not in granted]

    def build_account(self) -> str | None:
        """The service account Cloud Build runs a build as in the region, when the build names none; None: none."""
        name = f"projects/{self.project}/locations/{self.region}/defaultServiceAccount"
        answer = self._read("reading Cloud Build's default service account",
                            f"gcloud builds get-default-service-account --region={self.region} --project={self.project}",
                            lambda: self.clients.cloud_build(self.region).get_default_service_account(
                                request={"name": name}))
        return answer.service_account_email.rsplit("/", 1)[-1] or None  # projects/P/serviceAccounts/EMAIL

    def service_account_exists(self, email: str) -> bool:
        client = self._client("iam")
        return self._read(f"reading service account {email}", f"gcloud iam service-accounts describe {email}",
                          lambda: client.get_service_account(request={"name": f"projects/-/serviceAccounts/{email}"}),
                          absent_ok=True) is not None

    def missing_service_account_permissions(self, email: str, permissions: list[str]) -> list[str]:
        client = self._client("iam")
        response = self._read(
            f"testing permissions on {email}", f"gcloud iam service-accounts get-iam-policy {email}",
            lambda: client.test_iam_permissions(request={"resource": f"projects/-/serviceAccounts/{email}",
                                                         "permissions": permissions}))
        return [permission for permission in permissions if permission not in set(response.permissions)]

    @functools.cache  # noqa: B019
    def _project_policy(self) -> Any:
        client = self._client("projects")
        return self._read(f"reading {self.project}'s IAM policy (needs resourcemanager.projects.getIamPolicy, e.g. "
                          "roles/iam.securityReviewer)",
                          f"gcloud projects get-iam-policy {self.project} --flatten=bindings "
                          "--format='table(bindings.role,bindings.members)'",
                          lambda: client.get_iam_policy(request={"resource": f"projects/{self.project}"}))

    def project_roles(self, member: str) -> set[str]:
        return {binding.role for binding in self._project_policy().bindings if member in binding.members}

    def effective_policy(self, constraint: str) -> EffectivePolicy:
        name = constraint.split("/", 1)[1]
        client = self._client("org_policy")
        policy = self._read(
            f"reading the effective {constraint} (needs orgpolicy.policy.get, e.g. roles/orgpolicy.policyViewer)",
            describe_policy(constraint, self.project),
            lambda: client.get_effective_policy(request={"name": f"projects/{self.project}/policies/{name}"}),
            absent_ok=True)
        if policy is None:  # no policy anywhere above the project: the constraint's default, which allows
            return EffectivePolicy()
        rules = list(policy.spec.rules)
        return EffectivePolicy(
            allow_all=any(rule.allow_all for rule in rules),
            deny_all=any(rule.deny_all for rule in rules),
            allowed=tuple(value for rule in rules for value in rule.values.allowed_values),
            denied=tuple(value for rule in rules for value in rule.values.denied_values),
            conditional=any(rule.condition.expression for rule in rules))

    def subnetwork_private_google_access(self, subnetwork: str) -> bool | None:
        """Whether the subnetwork has Private Google Access; None where it does not exist."""
        found = re.search(r"(?:projects/(?P<project>[^/]+)/)?regions/(?P<region>[^/]+)/subnetworks/(?P<name>[^/]+)$",
                          subnetwork)
        project, region, name = ((found["project"] or self.project, found["region"], found["name"]) if found
                                 else (self.project, self.region, subnetwork))
        client = self._client("subnetworks")
        answer = self._read(f"reading subnetwork {name}", f"gcloud compute networks subnets describe {name} "
                            f"--region={region} --project={project} --format='value(privateIpGoogleAccess)'",
                            lambda: client.get(request={"project": project, "region": region, "subnetwork": name}),
                            absent_ok=True)
        return None if answer is None else bool(answer.private_ip_google_access)

    def bucket(self, name: str) -> BucketFacts | None:
        storage = self._client("storage")
        found = self._read(f"reading gs://{name}", f"gcloud storage buckets describe gs://{name}",
                           lambda: storage.lookup_bucket(name), absent_ok=True)
        return None if found is None else BucketFacts(location=found.location or "", location_type=found.location_type
                                                      or "")

    def missing_bucket_permissions(self, name: str, permissions: list[str]) -> list[str]:
        bucket = self._client("storage").bucket(name)
        granted = self._read(f"testing permissions on gs://{name}",
                             f"gcloud storage buckets get-iam-policy gs://{name}",
                             lambda: bucket.test_iam_permissions(permissions))
        return [permission for permission in permissions if permission not in set(granted)]

    def repository_roles(self, repository: str, member: str) -> set[str]:
        resource = f"projects/{self.project}/locations/{self.region}/repositories/{repository}"
        client = self._client("artifact_registry")
        policy = self._read(f"reading the repository {repository}'s IAM policy",
                            f"gcloud artifacts repositories get-iam-policy {repository} --location={self.region} "
                            f"--project={self.project}",
                            lambda: client.get_iam_policy(request={"resource": resource}), absent_ok=True)
        return set() if policy is None else {binding.role for binding in policy.bindings if member in binding.members}

    def bucket_roles(self, name: str, member: str) -> set[str]:
        bucket = self._client("storage").bucket(name)
        policy = self._read(f"reading gs://{name}'s IAM policy", f"gcloud storage buckets get-iam-policy gs://{name}",
                            lambda: bucket.get_iam_policy(requested_policy_version=3))
        return {binding["role"] for binding in policy.bindings if member in binding.get("members", ())}
