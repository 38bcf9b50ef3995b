"""The gcp profile's image: Cloud Build builds the rendered recipe into Artifact Registry."""

from __future__ import annotations

import io
import logging
import re
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING

from gpuflow.platform.base import ImageBuildResult, JobHandle
from gpuflow.platform.console import cloud_build_url
from gpuflow.platform.gcp_service import GcpService
from gpuflow.runs.naming import ResourceNames

if TYPE_CHECKING:
    from airflow.providers.google.cloud.hooks.cloud_build import CloudBuildHook
    from google.cloud.devtools import cloudbuild_v1

log = logging.getLogger(__name__)


class CloudBuildImages(GcpService):
    def image_exists(self, image: str) -> bool:
        """True when the Artifact Registry tag exists; images elsewhere are never assumed to exist."""
        from google.api_core.exceptions import NotFound
        from google.cloud import artifactregistry_v1

        found = re.fullmatch(r"([a-z0-9-]+)-docker\.pkg\.dev/([^/]+)/([^/]+)/(.+):([^:/]+)", image)
        if not found:
            return False
        location, project, repository, package, tag = found.groups()
        name = (f"projects/{project}/locations/{location}/repositories/{repository}/packages/"
                f"{package.replace('/', '%2F')}/tags/{tag}")
        try:
            self.clients.artifact_registry().get_tag(request=artifactregistry_v1.GetTagRequest(name=name))
            return True
        except NotFound:
            return False

    def cloud_build_request(self, source_object: str, image: str, names: ResourceNames) -> cloudbuild_v1.Build:
        from google.cloud.devtools import cloudbuild_v1
        from google.protobuf import duration_pb2

        return cloudbuild_v1.Build(
            source=cloudbuild_v1.Source(storage_source=cloudbuild_v1.StorageSource(bucket=names.bucket,
                                                                                   object_=source_object)),
            steps=[cloudbuild_v1.BuildStep(name="gcr.io/cloud-builders/docker", args=["build", "-t", image, "."])],
            images=[image],
            timeout=duration_pb2.Duration(seconds=self.config.container.build_timeout_s),
            options=cloudbuild_v1.BuildOptions(
                machine_type=cloudbuild_v1.BuildOptions.MachineType.E2_HIGHCPU_8, disk_size_gb=200,
                logging=cloudbuild_v1.BuildOptions.LoggingMode.CLOUD_LOGGING_ONLY,
            ),
            # Builds take tags, not labels: the run's and the deployment's, as label=value words.
            tags=["gpuflow", self.config.recipe, *(f"{key}-{value}" for key, value in names.labels.items())],
        )

    def build_image(self, context_dir: Path, image: str, names: ResourceNames) -> ImageBuildResult:
        """Skip an image whose tag exists; otherwise upload the context and start the build with the provider's
        CloudBuildHook. The task defers to the provider's CloudBuildCreateBuildTrigger until it ends."""
        if self.image_exists(image):
            return ImageBuildResult(image=image, built=False, context_dir=str(context_dir),
                                    detail="already in Artifact Registry (same build context); build skipped")
        earlier = self.running_build(names)
        if earlier is not None:  # a retry waits on the build its earlier try started
            log.info("Cloud Build %s that an earlier try started still runs: waiting on it, not starting another",
                     earlier.id)
            return ImageBuildResult(image=image, built=False, context_dir=str(context_dir), job=earlier,
                                    detail=f"building with Cloud Build {earlier.id} (an earlier try's)")
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w:gz") as tar:
            tar.add(context_dir, arcname=".")
        source_object = f"{names.object_prefix}/build/context.tar.gz"
        self._gcs().upload(names.bucket, source_object, data=archive.getvalue(), mime_type="application/gzip")
        _, build_id = self._build_hook().create_build_without_waiting_for_result(
            build=self.cloud_build_request(source_object, image, names), project_id=self.config.project,
            location=self.config.region)
        log.info("Cloud Build %s started for %s (%d KB context)", build_id, image, len(archive.getvalue()) // 1024)
        return ImageBuildResult(image=image, built=False, context_dir=str(context_dir),
                                job=self._build_handle(build_id), detail=f"building with Cloud Build {build_id}")

    def _build_handle(self, build_id: str) -> JobHandle:
        return JobHandle(kind="cloud-build", id=build_id, location=self.config.region,
                         name=f"projects/{self.config.project}/locations/{self.config.region}/builds/{build_id}",
                         url=cloud_build_url(self.config.project, self.config.region, build_id))

    #: Builds read back when looking for an earlier try's: the region's newest, where a build started minutes ago is.
    RECENT_BUILDS = 50

    def running_build(self, names: ResourceNames) -> JobHandle | None:
        """A build of this run (its ``gpuflow-run-…`` tag) still queued, pending or working, among the region's
        newest builds; matched here rather than with a list filter, whose syntax gpuflow has no page to cite for."""
        from google.cloud.devtools import cloudbuild_v1

        status = cloudbuild_v1.Build.Status
        tag = f"gpuflow-run-{names.labels['gpuflow-run']}"
        builds = self._build_hook().list_builds(location=self.config.region, project_id=self.config.project,
                                                page_size=self.RECENT_BUILDS)
        return next((self._build_handle(build.id) for build in builds
                     if tag in build.tags and build.status in (status.QUEUED, status.PENDING, status.WORKING)), None)

    def _build_hook(self) -> CloudBuildHook:
        from airflow.providers.google.cloud.hooks.cloud_build import CloudBuildHook

        return CloudBuildHook(**self.config.hook_identity(self.conn_id))

    def cancel_build(self, build_id: str) -> None:
        self._build_hook().cancel_build(id_=build_id, project_id=self.config.project, location=self.config.region)
        log.info("cancelled Cloud Build %s", build_id)
