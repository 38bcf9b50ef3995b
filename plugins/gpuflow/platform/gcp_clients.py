"""The Google API clients of the gcp profile, made from the Airflow connection.

Vertex AI, Cloud Build and Dataflow are reached through the provider's ``CustomJobHook``, ``CloudBuildHook`` and
``DataflowHook`` methods, and Dataflow's waits, listings and labels through its ``AsyncDataflowHook``. The clients
here are those for which the provider (22.8.0) has no hook method: Cloud Monitoring's time series, Artifact Registry tags, Compute
Engine quotas and accelerator types, Cloud Quotas, and what preflight's access check reads (Service Usage, Resource
Manager, IAM, Organization Policy, Compute Engine subnetworks; Cloud Storage through the provider's GCSHook). They are built with ``GoogleBaseHook``'s credentials and client
info. Tests replace the GAPIC client classes this module constructs, and those under the hooks, with fakes that
check every request against the API's own types, so the code here runs in tests as it runs in Airflow.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import cached_property
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow.providers.google.common.hooks.base_google import GoogleBaseHook
    from google.cloud import (
        artifactregistry_v1,
        compute_v1,
        iam_admin_v1,
        monitoring_v3,
        orgpolicy_v2,
        resourcemanager_v3,
        service_usage_v1,
        storage,
    )
    from google.cloud.devtools import cloudbuild_v1

    from gpuflow.gpus.quota import ComputeClients


class GcpClients:
    """Google's clients with the Airflow connection's credentials; ``impersonation_chain`` (the provider's own
    argument) overrides the connection's, as ``preflight --access --impersonate`` does to check another identity."""

    def __init__(self, conn_id: str, impersonation_chain: list[str] | None = None):
        self.conn_id, self._chain = conn_id, impersonation_chain

    @cached_property
    def _base_hook(self) -> GoogleBaseHook:
        from airflow.providers.google.common.hooks.base_google import GoogleBaseHook

        return GoogleBaseHook(gcp_conn_id=self.conn_id, impersonation_chain=self._chain)

    def _client_kwargs(self) -> dict[str, Any]:
        from airflow.providers.google.common.consts import CLIENT_INFO

        return {"credentials": self._base_hook.get_credentials(), "client_info": CLIENT_INFO}

    def impersonation_chain(self) -> list[str]:
        """The impersonation chain (given, else the connection extra's ``impersonation_chain``), last the target
        account."""
        if self._chain:
            return list(self._chain)
        chain = self._base_hook._get_field("impersonation_chain", None)  # as GoogleBaseHook reads it
        if isinstance(chain, str):
            chain = [account.strip() for account in chain.split(",") if account.strip()]
        return list(chain or [])

    @contextlib.contextmanager
    def credentials_for_subprocess(self) -> Iterator[None]:
        """The connection's key file as GOOGLE_APPLICATION_CREDENTIALS while Beam stages a job (ADC otherwise)."""
        with self._base_hook.provide_gcp_credential_file_as_context():
            yield

    def monitoring_async(self) -> monitoring_v3.MetricServiceAsyncClient:
        """Cloud Monitoring for the smoke test's GPU-metrics trigger (the provider's CloudMonitoringHook, 22.8.0, reads
        alert policies and notification channels, not time series)."""
        from google.cloud import monitoring_v3

        return monitoring_v3.MetricServiceAsyncClient(**self._client_kwargs())

    def artifact_registry(self) -> artifactregistry_v1.ArtifactRegistryClient:
        from google.cloud import artifactregistry_v1

        return artifactregistry_v1.ArtifactRegistryClient(**self._client_kwargs())

    def caller_email(self) -> str | None:
        """Who calls Google: the impersonated account, else the credentials' service account (None for a user's
        credentials, which do not carry their email)."""
        chain = self.impersonation_chain()
        if chain:
            return chain[-1]
        email = getattr(self._base_hook.get_credentials(), "service_account_email", None)
        return email if email and "@" in email else None

    def service_usage(self) -> service_usage_v1.ServiceUsageClient:
        from google.cloud import service_usage_v1

        return service_usage_v1.ServiceUsageClient(**self._client_kwargs())

    def cloud_build(self, location: str) -> cloudbuild_v1.CloudBuildClient:
        """Cloud Build's client as the provider's CloudBuildHook makes it (the hook has no method for the default
        service account)."""
        from airflow.providers.google.cloud.hooks.cloud_build import CloudBuildHook

        return CloudBuildHook(gcp_conn_id=self.conn_id, impersonation_chain=self._chain).get_conn(location=location)

    def projects(self) -> resourcemanager_v3.ProjectsClient:
        from google.cloud import resourcemanager_v3

        return resourcemanager_v3.ProjectsClient(**self._client_kwargs())

    def iam(self) -> iam_admin_v1.IAMClient:
        from google.cloud import iam_admin_v1

        return iam_admin_v1.IAMClient(**self._client_kwargs())

    def org_policy(self) -> orgpolicy_v2.OrgPolicyClient:
        from google.cloud import orgpolicy_v2

        return orgpolicy_v2.OrgPolicyClient(**self._client_kwargs())

    def subnetworks(self) -> compute_v1.SubnetworksClient:
        from google.cloud import compute_v1

        return compute_v1.SubnetworksClient(**self._client_kwargs())

    def storage(self) -> storage.Client:
        """Cloud Storage through the provider's GCSHook (the emulator's, where the environment names one)."""
        from airflow.providers.google.cloud.hooks.gcs import GCSHook

        return GCSHook(gcp_conn_id=self.conn_id, impersonation_chain=self._chain).get_conn()

    @cached_property
    def _compute(self) -> ComputeClients:
        """Compute Engine's three clients and Cloud Quotas', made once (one credentials lookup) for the quota and
        region reads."""
        from gpuflow.gpus.quota import compute_clients

        return compute_clients(self.conn_id, self._chain)

    def compute(self) -> ComputeClients:
        return self._compute

    def compute_accelerator_types(self) -> compute_v1.AcceleratorTypesClient:
        return self._compute.accelerator_types
