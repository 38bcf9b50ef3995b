"""Google Cloud services that no machine here can reach, faked at the client boundary.

Each fake takes the request object gpuflow's gcp platform sends, asserts that it is the API's own type
(``dataflow_v1beta3``, ``aiplatform_v1``, ``cloudbuild_v1``, ``artifactregistry_v1``, ``compute_v1``),
records it, and answers with the API's own response types, replaying the state sequences the services go
through. Where a real service would do work that later steps read back (Vertex AI writes the weights,
Dataflow workers run the pipeline and write the GPU report), the fake does that work on this machine:
the weights are exported by the uploaded script into the GCS emulator, and the streaming pipeline runs on
Beam's BundleBasedDirectRunner against the Pub/Sub emulator. Only the control planes are fake.

One module per Google service; this package exports them all.
"""

from __future__ import annotations

import json
import os

from tests.gcp_fakes.access import FakeProjectAccess, FakeStorageAccess, list_policy
from tests.gcp_fakes.clients import FakeGoogleCloud
from tests.gcp_fakes.cloud_build import FakeArtifactRegistry, FakeCloudBuild
from tests.gcp_fakes.compute import FakeAcceleratorTypesClient, FakeCloudQuotas, FakeProjectsClient, FakeRegionsClient
from tests.gcp_fakes.dataflow import (
    BATCH_SUCCEEDS,
    EXHAUSTED,
    L4_WORKER_REPORT,
    LAUNCH_FAILS,
    STREAMING_STARTS,
    STREAMING_STARTS_BY_AUTOSCALING,
    ZONE_EXHAUSTED,
    FakeDataflow,
    FakeJob,
    FakeWorkers,
    Importance,
    JobState,
)
from tests.gcp_fakes.gcs import file_patterns, read_gcs, write_gcs
from tests.gcp_fakes.monitoring import FakeMonitoring
from tests.gcp_fakes.vertex import FakeVertex
from tests.helpers import ROOT

__all__ = [
    "BATCH_SUCCEEDS", "DIRECT", "EXHAUSTED", "FLEX", "L4_WORKER_REPORT", "LAUNCH_FAILS", "STREAMING_STARTS",
    "STREAMING_STARTS_BY_AUTOSCALING", "ZONE_EXHAUSTED", "FakeAcceleratorTypesClient", "FakeArtifactRegistry",
    "FakeCloudBuild", "FakeCloudQuotas", "FakeDataflow", "FakeGoogleCloud", "FakeJob", "FakeMonitoring",
    "FakeProjectAccess", "FakeStorageAccess", "list_policy",
    "FakeProjectsClient", "FakeRegionsClient", "FakeVertex", "FakeWorkers", "Importance", "JobState", "gcp_test_config", "gcp_test_environment",
    "file_patterns", "read_gcs", "write_gcs",
]


#: launch.mode flex_template with its launcher image pinned (a tag shaped like the Flex Template page's; tests pull
#: nothing).
FLEX = ("launch.mode=flex_template", "container.flex_launcher_tag=20260101_RC00")
#: launch.mode direct: Airflow's own Beam stages the job (the gcp default is flex_template).
DIRECT = ("launch.mode=direct",)


def gcp_test_config(*overrides: str):
    """configs/gcp.example.yaml in the test project, polling at once: the unit tests' gcp configuration."""
    from gpuflow.configuration.loading import load_config
    from tests.helpers import GCP_TEST_PROJECT

    return load_config("configs/gcp.example.yaml", overrides=[
        f"project={GCP_TEST_PROJECT}", "dataflow.poll_interval_s=0.001", *overrides])


def gcp_test_environment(emulator_env: dict[str, str], project: str, conn_id: str) -> dict[str, str]:
    """The emulators behind the gcp profile's hooks: an anonymous connection, no metadata-server probing, and
    anonymous Application Default Credentials at once in subprocesses (tests/anonymous_adc/sitecustomize.py)."""
    connection = {"conn_type": "google_cloud_platform", "extra": {"is_anonymous": True, "project": project}}
    python_path = os.pathsep.join(filter(None, [str(ROOT / "tests" / "anonymous_adc"), os.environ.get("PYTHONPATH")]))
    return {**os.environ, **emulator_env, f"AIRFLOW_CONN_{conn_id.upper()}": json.dumps(connection),
            "NO_GCE_CHECK": "True", "GOOGLE_CLOUD_PROJECT": project, "PUBSUB_PROJECT_ID": project,
            "PYTHONPATH": python_path}
