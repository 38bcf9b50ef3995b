"""Cloud Composer, faked at the client boundary under the provider's CloudComposerHook.

The environments API is an autospec of ``service.environments.EnvironmentsClient`` answering from one environment's
state (its image, bucket, Airflow URI and custom PyPI packages); ``update_environment`` applies its mask as
Composer does: ``config.softwareConfig.pypiPackages`` replaces the whole map. The environment's Airflow REST API
(v2) answers the pool calls the hook's ``make_composer_airflow_api_request`` sends, from the request's method,
path and body.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from google.cloud.orchestration.airflow import service_v1

from tests.gcp_fakes.access import _typed, autospec_client

ENVIRONMENTS_CLIENT = service_v1.EnvironmentsClient


@dataclass
class FakeAirflowApiResponse:
    status_code: int
    body: dict[str, Any]

    def json(self) -> dict[str, Any]:
        return self.body

    @property
    def text(self) -> str:
        return json.dumps(self.body)


class FakeUpdateOperation:
    """The long-running operation of an environment update, as ``google.api_core.operation.Operation`` answers
    ``result()``: the environment once the update has run, or the operation's error raised as a
    ``GoogleAPICallError`` (then Composer keeps the previous package list)."""

    def __init__(self, composer: FakeComposer, packages: dict[str, str]):
        self.composer, self.packages = composer, packages

    def result(self, timeout=None, polling=None, retry=None):
        from google.api_core.exceptions import FailedPrecondition

        self.composer.events.append("update finished")
        if self.composer.update_error:
            raise FailedPrecondition(self.composer.update_error)
        self.composer.pypi_packages = self.packages  # the whole map
        return self.composer.environment()

    def exception(self, timeout=None):
        return None


@dataclass
class FakeComposer:
    name: str = "projects/gpuflow-gcp-test/locations/europe-west4/environments/shared"
    image_version: str = "composer-3-airflow-3.3.1-build.10"
    bucket: str = "composer-shared-bucket"
    pypi_packages: dict[str, str] = field(default_factory=lambda: {"pandas-gbq": "==0.29.0", "openai": "==1.99.0"})
    pools: dict[str, dict] = field(default_factory=dict)
    airflow_uri: str = "https://abc-dot-europe-west4.composer.googleusercontent.com"
    requests: list[Any] = field(default_factory=list)
    api_calls: list[tuple[str, str, Any]] = field(default_factory=list)
    #: The order of what changed the environment: "update sent", "update finished", "POST /api/v2/pools".
    events: list[str] = field(default_factory=list)
    #: The error the package update's operation ends with (a package conflict), or None: it succeeds.
    update_error: str | None = None
    #: The status the Airflow REST API answers every call with (403: the identity may not use it), or None.
    api_refuses: int | None = None
    #: How many Airflow triggerers the environment's workloads configuration has.
    triggerers: int = 1
    #: What the environments API raises for a get (a google.api_core exception: NotFound, ServiceUnavailable), or None.
    get_raises: Exception | None = None

    def environment(self) -> service_v1.Environment:
        return service_v1.Environment(name=self.name, config=service_v1.EnvironmentConfig(
            dag_gcs_prefix=f"gs://{self.bucket}/dags", airflow_uri=self.airflow_uri,
            software_config=service_v1.SoftwareConfig(image_version=self.image_version,
                                                      pypi_packages=dict(self.pypi_packages)),
            workloads_config=service_v1.WorkloadsConfig(
                triggerer=service_v1.WorkloadsConfig.TriggererResource(count=self.triggerers, cpu=0.5,
                                                                       memory_gb=1))))

    def get_environment(self, request=None, **_options):
        request = _typed(service_v1.GetEnvironmentRequest, request)
        self.requests.append(request)
        if self.get_raises is not None:
            raise self.get_raises
        assert request.name == self.name, request.name
        return self.environment()

    def update_environment(self, request=None, **_options):
        request = _typed(service_v1.UpdateEnvironmentRequest, request)
        self.requests.append(request)
        assert request.name == self.name and list(request.update_mask.paths) == ["config.softwareConfig.pypiPackages"]
        self.events.append("update sent")
        return FakeUpdateOperation(self, dict(request.environment.config.software_config.pypi_packages))

    def airflow_api(self, method: str, url: str, data=None, headers=None, timeout=None):
        """The environment's Airflow REST API v2, as far as pools go."""
        assert url.startswith(self.airflow_uri + "/api/v2/pools"), url
        self.api_calls.append((method, url, data))
        if self.api_refuses:
            return FakeAirflowApiResponse(self.api_refuses, {"detail": "Forbidden"})
        path = url.removeprefix(self.airflow_uri)
        if method == "GET":
            name = path.rsplit("/", 1)[1]
            return (FakeAirflowApiResponse(200, self.pools[name]) if name in self.pools
                    else FakeAirflowApiResponse(404, {"detail": f"Pool with name: `{name}` was not found"}))
        assert method == "POST" and path == "/api/v2/pools"
        body = json.loads(data)
        assert set(body) >= {"name", "slots"}
        if body["name"] in self.pools:
            return FakeAirflowApiResponse(409, {"detail": "Pool already exists"})
        self.pools[body["name"]] = body
        self.events.append("POST /api/v2/pools")
        return FakeAirflowApiResponse(201, body)

    def install(self, monkeypatch) -> FakeComposer:
        from airflow.providers.google.cloud.hooks import cloud_composer

        composer = self
        client = autospec_client(ENVIRONMENTS_CLIENT, {"get_environment": self.get_environment,
                                                       "update_environment": self.update_environment})

        class Session:  # google.auth's AuthorizedSession, as the hook makes it: credentials in, requests out
            def __init__(self, credentials):
                assert credentials is not None

            def request(self, method, url, data=None, headers=None, timeout=None):
                return composer.airflow_api(method, url, data=data, headers=headers, timeout=timeout)

        monkeypatch.setattr(cloud_composer.CloudComposerHook, "get_environment_client", lambda hook: client)
        monkeypatch.setattr(cloud_composer, "AuthorizedSession", Session)
        return self
