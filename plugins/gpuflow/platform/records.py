"""Where a deployment's state and a run's ownership are written down, so that the next run, the teardown and the
janitor find them:

* the deployment record (``gpuflow.runs.rollout.DeploymentRecord``): a local file on the local profile (written to a
  temporary name, then renamed over the old one), an object in the bucket on gcp (one upload replaces an object
  whole; with a generation precondition, so that two writers cannot overwrite each other unseen);
* model version pointers, in the deployment's model folder that the job watches;
* run leases: which DAG run a ``gf-`` prefix belongs to, beside the run's objects, read by the janitor.
"""

from __future__ import annotations

import json
import logging
import time
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuflow.configuration.model import GpuflowConfig
from gpuflow.gcs_uris import split_gcs_uri
from gpuflow.platform.processes import replace_text
from gpuflow.runs.naming import DEPLOYMENTS_FOLDER, ResourceNames, deployment_folder, pointer_folder, resource_names
from gpuflow.runs.rollout import DeploymentRecord, pointer_name

if TYPE_CHECKING:
    from airflow.providers.google.cloud.hooks.gcs import GCSHook

log = logging.getLogger(__name__)

LEASE_FILE = "run.json"
#: A deployment folder's owner mark, written by the run that first serves it: objects carry no labels, so this is
#: the janitor's proof that the folder is gpuflow's.
DEPLOYMENT_MARK = "owner.json"


class RecordConflict(RuntimeError):
    """Another writer changed the record since this run read it."""


class Records:
    def __init__(self, config: GpuflowConfig, conn_id: str):
        self.config, self.conn_id = config, conn_id

    @cached_property
    def gcs(self) -> GCSHook:
        from airflow.providers.google.cloud.hooks.gcs import GCSHook

        return GCSHook(**self.config.hook_identity(self.conn_id))

    # -- deployment records -----------------------------------------------------------------------
    def record_location(self, name: str) -> str:
        if self.config.profile == "local":
            return str(Path(self.config.local.state_dir) / "deployments" / f"{name}.json")
        return f"{deployment_folder(self.config, name)}/deployment.json"

    def read(self, name: str) -> DeploymentRecord | None:
        return self._current(name)[0]

    def _current(self, name: str) -> tuple[DeploymentRecord | None, int]:
        """The record and, on gcp, the object's generation, read together (0: there is none)."""
        location = self.record_location(name)
        if self.config.profile == "local":
            try:
                return DeploymentRecord.model_validate_json(Path(location).read_text()), 0
            except FileNotFoundError:
                return None, 0
        bucket, blob_name = split_gcs_uri(location)
        blob = self.gcs.get_conn().bucket(bucket).get_blob(blob_name)  # its metadata, generation included
        if blob is None:
            return None, 0
        return DeploymentRecord.model_validate_json(blob.download_as_text()), blob.generation

    def write(self, record: DeploymentRecord, expected: DeploymentRecord | None = None) -> str:
        """Replace the record whole. ``expected``: the record this run read; a different one there now fails."""
        location = self.record_location(record.name)
        text = record.model_dump_json(indent=2)
        current, generation = self._current(record.name)
        if (current and current.changed_at) != (expected and expected.changed_at):
            raise RecordConflict(f"the record of deployment {record.name} ({location}) changed while this run ran "
                                 f"(now: {current and current.changed_by}). Fix: run again; the deployment is as the "
                                 "other run left it.")
        if self.config.profile == "local":
            replace_text(Path(location), text)  # a reader sees the old record or the new one
        else:
            bucket, blob_name = split_gcs_uri(location)
            # if_generation_match 0: only if absent; else only if it is still the generation just compared.
            self.gcs.get_conn().bucket(bucket).blob(blob_name).upload_from_string(
                text, content_type="application/json", if_generation_match=generation)
        log.info("deployment %s recorded at %s: job %s, model version %s", record.name, location, record.job_name,
                 record.model_version)
        return location

    def delete(self, name: str) -> None:
        location = self.record_location(name)
        if self.config.profile == "local":
            Path(location).unlink(missing_ok=True)
        else:
            bucket, blob_name = split_gcs_uri(location)
            blob = self.gcs.get_conn().bucket(bucket).get_blob(blob_name)
            if blob is not None:
                blob.delete()

    def recorded(self) -> list[DeploymentRecord]:
        """Every deployment recorded where this configuration keeps them (for the janitor)."""
        if self.config.profile == "local":
            folder = Path(self.config.local.state_dir) / "deployments"
            return [DeploymentRecord.model_validate_json(p.read_text()) for p in sorted(folder.glob("*.json"))]
        if not self.config.bucket:
            return []
        return [DeploymentRecord.model_validate_json(self.gcs.download(self.config.bucket, name))
                for name in self.gcs.list(self.config.bucket, prefix=f"{DEPLOYMENTS_FOLDER}/")
                if name.endswith("/deployment.json")]

    # -- model version pointers ---------------------------------------------------------------------
    def write_pointer(self, name: str, version: str, model_dir: str, state_dict: str) -> str:
        """Point the deployment's job at a model version: one new file in the folder it watches (a new name each
        time: WatchFilePattern ignores a name it has seen)."""
        uri = f"{pointer_folder(self.config, name)}/{pointer_name(version)}"
        bucket, blob = split_gcs_uri(uri)
        self.gcs.upload(bucket, blob, data=json.dumps(
            {"version": version, "model_dir": model_dir, "state_dict_path": state_dict}), mime_type="application/json")
        log.info("model version pointer %s -> %s", uri, version)
        return uri

    def has_pointer(self, name: str) -> bool:
        """Whether the deployment's pointer folder holds any version pointer."""
        bucket, prefix = split_gcs_uri(pointer_folder(self.config, name) + "/")
        return any(blob.endswith(".json") for blob in self.gcs.list(bucket, prefix=prefix, delimiter="/"))

    # -- run leases ------------------------------------------------------------------------------
    def write_lease(self, names: ResourceNames, dag_id: str, run_id: str) -> None:
        """Which DAG run owns the ``gf-`` prefix (and which deployment it serves), beside the run's objects; a
        deployment's run also marks the deployment's folder as gpuflow's, once."""
        lease = {"dag_id": dag_id, "run_id": run_id, "deployment": names.deployment, "written_at": time.time(),
                 "labels": names.labels}  # objects have none: the janitor reads the run's site here
        bucket, blob = split_gcs_uri(names.gcs_uri(LEASE_FILE))
        self.gcs.upload(bucket, blob, data=json.dumps(lease), mime_type="application/json")
        if names.deployment:
            bucket, blob = split_gcs_uri(f"{deployment_folder(self.config, names.deployment)}/{DEPLOYMENT_MARK}")
            if not self.gcs.exists(bucket, blob):
                self.gcs.upload(bucket, blob, data=json.dumps(lease), mime_type="application/json")

    def read_lease(self, prefix: str, bucket: str | None = None) -> dict[str, Any] | None:
        """The run's lease, in the configured bucket, or in ``bucket`` (a run's own bucket holds its lease)."""
        config = self.config.model_copy(update={"bucket": bucket}) if bucket else self.config
        return self._read_json(resource_names(config, prefix).gcs_uri(LEASE_FILE))

    def read_owner_mark(self, deployment: str) -> dict[str, Any] | None:
        """The owner mark of a deployment's folder: the lease of the run that first served it."""
        return self._read_json(f"{deployment_folder(self.config, deployment)}/{DEPLOYMENT_MARK}")

    def _read_json(self, uri: str) -> dict[str, Any] | None:
        bucket, blob = split_gcs_uri(uri)
        try:
            if not self.gcs.exists(bucket, blob):
                return None
            found: dict[str, Any] = json.loads(self.gcs.download(bucket, blob))
            return found
        except Exception as error:  # a bucket gone or unreadable: nothing to go by
            log.info("nothing to read at %s (%s)", uri, error)
            return None
