"""Cloud Build and Artifact Registry: a build records its image as a tag."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

from google.api_core.exceptions import NotFound
from google.cloud import artifactregistry_v1, dataflow_v1beta3
from google.cloud.devtools import cloudbuild_v1

JobState = dataflow_v1beta3.JobState
Importance = dataflow_v1beta3.JobMessageImportance


class FakeCloudBuild:
    """Cloud Build: QUEUED, WORKING (``polls_until_done``: both, one or neither), then SUCCESS (the tag then exists in
    the fake registry) or FAILURE."""

    def __init__(self, registry: FakeArtifactRegistry, fail_with: str = "",
                 default_account: str = "123456789012@cloudbuild.gserviceaccount.com", polls_until_done: int = 2):
        self.registry, self.fail_with, self.polls_until_done = registry, fail_with, polls_until_done
        self.default_account = default_account  # what the project's organization settings chose; "" for none
        self.requests: list[tuple[str, Any]] = []
        self.statuses: list[Any] = []

    def create_build(self, request):
        assert isinstance(request, cloudbuild_v1.CreateBuildRequest)
        self.requests.append(("create_build", request))
        status = cloudbuild_v1.Build.Status
        self.statuses = [*[status.QUEUED, status.WORKING][2 - self.polls_until_done:],
                         status.FAILURE if self.fail_with else status.SUCCESS]
        return SimpleNamespace(metadata=cloudbuild_v1.BuildOperationMetadata(
            build=cloudbuild_v1.Build(id="b7e1c0de", status=status.QUEUED)))

    def get_build(self, request):
        assert isinstance(request, cloudbuild_v1.GetBuildRequest)
        self.requests.append(("get_build", request))
        state = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
        if state == cloudbuild_v1.Build.Status.SUCCESS:
            (create,) = [r for n, r in self.requests if n == "create_build"][-1:]
            self.registry.tags.update(create.build.images)
        return cloudbuild_v1.Build(id=request.id, status=state, status_detail=self.fail_with,
                                   log_url="https://console.cloud.google.com/cloud-build/builds/b7e1c0de")

    def list_builds(self, request):
        """The builds created under the request's parent (one page, newest first), each in its status now."""
        assert isinstance(request, cloudbuild_v1.ListBuildsRequest) and not request.filter
        self.requests.append(("list_builds", request))
        created = [r for n, r in self.requests if n == "create_build" and r.parent == request.parent]
        status = self.statuses[0] if created else None
        return cloudbuild_v1.ListBuildsResponse(builds=[
            cloudbuild_v1.Build(id="b7e1c0de", tags=create.build.tags, images=create.build.images, status=status)
            for create in reversed(created)][:request.page_size or None])

    def get_default_service_account(self, request):
        assert isinstance(request, cloudbuild_v1.GetDefaultServiceAccountRequest)
        found = re.fullmatch(r"projects/(?P<project>[^/]+)/locations/[a-z0-9-]+/defaultServiceAccount", request.name)
        assert found, request.name
        self.requests.append(("get_default_service_account", request))
        email = f"projects/{found['project']}/serviceAccounts/{self.default_account}" if self.default_account else ""
        return cloudbuild_v1.DefaultServiceAccount(name=request.name, service_account_email=email)

    def cancel_build(self, request):
        assert isinstance(request, cloudbuild_v1.CancelBuildRequest)
        self.requests.append(("cancel_build", request))
        self.statuses = [cloudbuild_v1.Build.Status.CANCELLED]


class FakeArtifactRegistry:
    def __init__(self):
        self.tags: set[str] = set()  # image URIs with their tag
        self.repository_bindings: dict[str, list[str]] = {}  # role -> members, on every repository
        self.requests: list[Any] = []

    def get_iam_policy(self, request):
        from google.iam.v1 import iam_policy_pb2, policy_pb2

        assert isinstance(request, iam_policy_pb2.GetIamPolicyRequest)
        assert re.fullmatch(r"projects/[^/]+/locations/[^/]+/repositories/[^/]+", request.resource), request.resource
        self.requests.append(request)
        return policy_pb2.Policy(bindings=[policy_pb2.Binding(role=role, members=members)
                                           for role, members in self.repository_bindings.items()])

    def get_tag(self, request):
        assert isinstance(request, artifactregistry_v1.GetTagRequest)
        self.requests.append(request)
        parts = request.name.split("/")  # projects/P/locations/L/repositories/R/packages/PKG/tags/T
        image = f"{parts[3]}-docker.pkg.dev/{parts[1]}/{parts[5]}/{parts[7].replace('%2F', '/')}:{parts[9]}"
        if image not in self.tags:
            raise NotFound(f"Requested entity was not found: {request.name}")
        return artifactregistry_v1.Tag(name=request.name)
