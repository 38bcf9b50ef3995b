"""The clients the provider's hooks make, answered by the fakes with the API's own request types; and
FakeGoogleCloud, which installs them under the hooks."""

from __future__ import annotations

import sys
from typing import Any

from google.cloud import aiplatform_v1, dataflow_v1beta3, monitoring_v3
from google.cloud.dataflow_v1beta3.services.messages_v1_beta3 import pagers
from google.cloud.devtools import cloudbuild_v1

from tests.gcp_fakes.access import ACCESS_CLIENTS, FakeProjectAccess, as_api_type
from tests.gcp_fakes.cloud_build import FakeArtifactRegistry, FakeCloudBuild
from tests.gcp_fakes.compute import FakeAcceleratorTypesClient, FakeCloudQuotas, FakeProjectsClient, FakeRegionsClient
from tests.gcp_fakes.dataflow import FakeDataflow, FakeDataflowRest
from tests.gcp_fakes.monitoring import FakeMonitoring
from tests.gcp_fakes.vertex import FakeVertex

JobState = dataflow_v1beta3.JobState
Importance = dataflow_v1beta3.JobMessageImportance


#: The requests each fake answers, by method: what the real GAPIC client turns a dict request into.
DATAFLOW_REQUESTS = {"get_job": dataflow_v1beta3.GetJobRequest, "update_job": dataflow_v1beta3.UpdateJobRequest,
                     "list_jobs": dataflow_v1beta3.ListJobsRequest,
                     "list_job_messages": dataflow_v1beta3.ListJobMessagesRequest}
VERTEX_REQUESTS = {"create_custom_job": aiplatform_v1.CreateCustomJobRequest,
                   "get_custom_job": aiplatform_v1.GetCustomJobRequest,
                   "list_custom_jobs": aiplatform_v1.ListCustomJobsRequest,
                   "cancel_custom_job": aiplatform_v1.CancelCustomJobRequest}
CLOUD_BUILD_REQUESTS = {"create_build": cloudbuild_v1.CreateBuildRequest, "get_build": cloudbuild_v1.GetBuildRequest,
                        "list_builds": cloudbuild_v1.ListBuildsRequest,
                        "cancel_build": cloudbuild_v1.CancelBuildRequest,
                        "get_default_service_account": cloudbuild_v1.GetDefaultServiceAccountRequest}


class TypedClient:
    """A fake in place of the GAPIC client a provider hook makes, so that the hook's own code runs.

    A dict request becomes the API's request type, as the real client does; anything else (a wrong type)
    reaches the fake, which refuses it. Unknown attributes (path helpers such as ``custom_job_path``) come from
    the real client class, and a method the fake does not answer fails the test."""

    def __init__(self, fake: Any, requests: dict[str, type], real_class: type):
        missing = [method for method in requests if not callable(getattr(real_class, method, None))]
        assert not missing, f"{real_class.__name__} has no {missing}"  # answer only what the real client has
        self._fake, self._requests, self._real_class = fake, requests, real_class

    def _typed(self, method: str, request: Any) -> Any:
        return as_api_type(self._requests[method], request)

    def __getattr__(self, name: str) -> Any:
        if name not in self._requests:
            return getattr(self._real_class, name)

        def call(request=None, **_options):
            return getattr(self._fake, name)(self._typed(name, request))

        return call


class AsyncTypedClient(TypedClient):
    """The async twin of TypedClient, for the provider's async hooks in triggers (pagers become async pagers)."""

    def __getattr__(self, name: str) -> Any:
        if name not in self._requests:
            return getattr(self._real_class, name)

        async def call(request=None, **_options):
            answer = getattr(self._fake, name)(self._typed(name, request))
            if isinstance(answer, pagers.ListJobMessagesPager):
                async def no_next_page(request, **kwargs):
                    raise AssertionError("one page only: the response has no next_page_token")

                return pagers.ListJobMessagesAsyncPager(method=no_next_page, request=answer._request,
                                                        response=answer._response)
            if isinstance(answer, list):  # a one-page listing, iterated as the async pager is
                return _AsyncItems(answer)
            return answer

        return call


class _AsyncItems:
    def __init__(self, items: list):
        self.items = items

    async def __aiter__(self):
        for item in self.items:
            yield item


def own_clients() -> list[tuple[Any, str, dict[str, type], type]]:
    """The GAPIC clients gpuflow constructs itself and the fakes answer: (module, class name, method -> request type,
    typed wrapper). Every method here is one gpuflow's code calls (tests/unit/test_permission_ledger.py)."""
    from google.cloud import artifactregistry_v1, cloudquotas_v1, compute_v1
    from google.iam.v1 import iam_policy_pb2

    return [
        (monitoring_v3, "MetricServiceAsyncClient", {"list_time_series": monitoring_v3.ListTimeSeriesRequest},
         AsyncTypedClient),
        (artifactregistry_v1, "ArtifactRegistryClient",
         {"get_tag": artifactregistry_v1.GetTagRequest, "get_iam_policy": iam_policy_pb2.GetIamPolicyRequest},
         TypedClient),
        (compute_v1, "RegionsClient", {"get": compute_v1.GetRegionRequest}, TypedClient),
        (compute_v1, "ProjectsClient", {"get": compute_v1.GetProjectRequest}, TypedClient),
        (compute_v1, "AcceleratorTypesClient", {"aggregated_list": compute_v1.AggregatedListAcceleratorTypesRequest},
         TypedClient),
        (cloudquotas_v1, "CloudQuotasClient", {"get_quota_info": cloudquotas_v1.GetQuotaInfoRequest}, TypedClient),
    ]


class FakeGoogleCloud:
    """Google Cloud's control planes, installed at the client boundary.

    It sits under the provider's hooks that gpuflow calls (CustomJobHook, CloudBuildHook, DataflowHook,
    AsyncDataflowHook, CustomJobAsyncHook, CloudBuildAsyncHook), in place of the clients they make, and under
    gpuflow's own client factory (gpuflow.platform.gcp_clients.GcpClients, gpuflow.gpus.quota.compute_clients), in place
    of the GAPIC client classes it constructs, so the hooks', the triggers' and the factory's own code runs: the
    connection's credentials, client info and impersonation chain."""

    def __init__(self, dataflow=None, vertex=None, build=None, registry=None, regions=None, monitoring=None,
                 projects=None, accelerator_types=None, cloud_quotas=None, access=None):
        self.registry = registry or FakeArtifactRegistry()
        self.metrics = monitoring or FakeMonitoring()
        self.dataflow = dataflow or FakeDataflow()
        self.vertex = vertex or FakeVertex()
        self.build = build or FakeCloudBuild(self.registry)
        self.projects = projects or FakeProjectsClient()
        self.accelerator_types = accelerator_types or FakeAcceleratorTypesClient()
        self.cloud_quotas = cloud_quotas or FakeCloudQuotas()
        self.access = access or FakeProjectAccess()  # what preflight's access check reads: a project in order
        self.installed = False
        self.clients_made: list[tuple[str, dict]] = []  # (client class, its keyword arguments), as gpuflow made them
        #: (hook class, gcp_conn_id, impersonation_chain) of every provider hook made while installed: every Google
        #: call, the emulators' included, goes through one (gpuflow's own clients take a GoogleBaseHook's credentials)
        self.hooks_made: list[tuple[str, str, Any]] = []
        self.regions = regions or FakeRegionsClient({"us-central1": [("NVIDIA_L4_GPUS", 8, 0)],
                                                     "us-east4": [("NVIDIA_L4_GPUS", 8, 0)]})

    def install(self, monkeypatch) -> FakeGoogleCloud:
        import json
        import os

        from airflow.providers.google.cloud.hooks import cloud_build
        from airflow.providers.google.cloud.hooks.dataflow import AsyncDataflowHook, DataflowHook
        from airflow.providers.google.cloud.hooks.vertex_ai.custom_job import CustomJobAsyncHook, CustomJobHook
        from google.cloud.aiplatform_v1 import JobServiceAsyncClient, JobServiceClient

        cloud = self
        if "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT" not in os.environ:  # the factory reads a connection: an anonymous one
            monkeypatch.setenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", json.dumps(
                {"conn_type": "google_cloud_platform", "extra": {"is_anonymous": True, "project": "gpuflow-test"}}))
        self._install_own_clients(monkeypatch)
        self._record_hooks(monkeypatch)
        self.installed = True
        monkeypatch.setattr(CustomJobHook, "get_job_service_client",
                            lambda hook, region=None: TypedClient(cloud.vertex, VERTEX_REQUESTS, JobServiceClient))

        async def vertex_async(hook, region=None):
            return AsyncTypedClient(cloud.vertex, VERTEX_REQUESTS, JobServiceAsyncClient)

        async def dataflow_async(hook, client_class):  # each Dataflow client answers its own methods only
            return AsyncTypedClient(cloud.dataflow, {method: request for method, request in DATAFLOW_REQUESTS.items()
                                                     if hasattr(client_class, method)}, client_class)

        monkeypatch.setattr(CustomJobAsyncHook, "get_job_service_client", vertex_async)
        monkeypatch.setattr(DataflowHook, "get_conn", lambda hook: FakeDataflowRest(cloud.dataflow))
        monkeypatch.setattr(AsyncDataflowHook, "initialize_client", dataflow_async)
        monkeypatch.setattr(cloud_build.CloudBuildHook, "get_conn", lambda hook, location="global": TypedClient(
            cloud.build, CLOUD_BUILD_REQUESTS, cloudbuild_v1.CloudBuildClient))
        monkeypatch.setattr(cloud_build, "CloudBuildAsyncClient", lambda **kwargs: AsyncTypedClient(
            cloud.build, CLOUD_BUILD_REQUESTS, cloudbuild_v1.CloudBuildAsyncClient))
        return self

    def _record_hooks(self, monkeypatch) -> None:
        """Record who each provider hook acts as, sync and async (an async hook keeps its arguments for its sync
        hook), then let the hook's own __init__ run."""
        from airflow.providers.google.common.hooks.base_google import GoogleBaseAsyncHook, GoogleBaseHook

        made = self.hooks_made
        sync_init, async_init = GoogleBaseHook.__init__, GoogleBaseAsyncHook.__init__

        def sync_hook(hook, *args: Any, **kwargs: Any) -> None:
            sync_init(hook, *args, **kwargs)
            made.append((type(hook).__name__, hook.gcp_conn_id, hook.impersonation_chain))

        def async_hook(hook, **kwargs: Any) -> None:
            async_init(hook, **kwargs)
            made.append((type(hook).__name__, kwargs.get("gcp_conn_id", "google_cloud_default"),
                         kwargs.get("impersonation_chain")))

        monkeypatch.setattr(GoogleBaseHook, "__init__", sync_hook)
        monkeypatch.setattr(GoogleBaseAsyncHook, "__init__", async_hook)

    def _client_factory(self, real_class: type, fake: Any, requests: dict[str, type], typed: type = TypedClient):
        """A stand-in for a GAPIC client class that gpuflow constructs itself (``GcpClients``, ``quota``): it checks
        that the client gets the connection's credentials, then answers with ``fake()`` (read when the client is
        made, so a test may replace a fake after install)."""

        def make(*args: Any, **kwargs: Any) -> TypedClient:
            assert not args, f"{real_class.__name__} takes keyword arguments only"
            assert kwargs.get("credentials") is not None, f"{real_class.__name__} made without credentials"
            self.clients_made.append((real_class.__name__, kwargs))
            return typed(fake(), requests, real_class)

        return make

    def _install_own_clients(self, monkeypatch) -> None:
        fakes = {"MetricServiceAsyncClient": lambda: self.metrics, "ArtifactRegistryClient": lambda: self.registry,
                 "RegionsClient": lambda: self.regions, "ProjectsClient": lambda: self.projects,
                 "AcceleratorTypesClient": lambda: self.accelerator_types,
                 "CloudQuotasClient": lambda: self.cloud_quotas}
        own = [(module, name, fakes[name], requests, typed) for module, name, requests, typed in own_clients()]
        for module, name, fake, requests, typed in own:
            monkeypatch.setattr(module, name, self._client_factory(getattr(module, name), fake, requests, typed))
        for real_class in ACCESS_CLIENTS:  # autospec fakes, made when the client is (a test may swap access)
            monkeypatch.setattr(sys.modules[real_class.__module__.rsplit(".services", 1)[0]], real_class.__name__,
                                self._autospec_factory(real_class))

    def _autospec_factory(self, real_class: type):
        def make(*args: Any, **kwargs: Any):
            assert not args and kwargs.get("credentials") is not None, f"{real_class.__name__} made without credentials"
            self.clients_made.append((real_class.__name__, kwargs))
            return self.access.client(real_class)

        return make
