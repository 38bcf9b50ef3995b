"""``gpuflow deploy-composer``: gpuflow into a Cloud Composer environment, through the provider's hooks.

- The environment (its image version, bucket, Airflow URI and custom PyPI packages) is read with
  ``CloudComposerHook.get_environment``; an image below gpuflow's floor is refused before anything changes.
- The PyPI packages are merged: every package the environment has stays, gpuflow's are added or raised, and the
  merged map goes back with ``CloudComposerHook.update_environment`` (mask ``config.softwareConfig.pypiPackages``,
  which replaces the whole map). Not ``gcloud composer environments update --update-pypi-packages-from-file``:
  the Google Cloud CLI builds that update with "clear all packages" set (its ``environment_patch_util.py``), and
  on a shared environment it would remove other teams' packages.
- dags/, plugins/gpuflow/ and data/ are copied with ``GCSHook``; what the last deploy copied and this one does
  not ship is removed (the manifest at ``composer.MANIFEST``), and nothing else.
- The ``gpuflow_gpu`` pool is created through the environment's Airflow REST API (v2 for Airflow 3, "always
  enabled" with Composer's own authentication: docs.cloud.google.com/composer/docs/composer-3/access-airflow-api),
  with ``CloudComposerHook.make_composer_airflow_api_request``.
- ``--config``: the team's configuration becomes the DAGs' default (``paths.SITE_CONFIG`` under data/); no
  repository file lies there, so a redeploy without ``--config`` never touches it.

A dry run reads the environment and prints what would change, and writes nothing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuflow.composer import (
    MANIFEST,
    composer_ranges,
    deploy_files,
    image_too_old,
    merged_packages,
    stale_files,
)
from gpuflow.operators.base import GPU_POOL
from gpuflow.paths import SITE_CONFIG
from gpuflow.platform.composer_api import ComposerTarget, read_pool

log = logging.getLogger(__name__)

#: The Airflow pool of the tasks that start GPU jobs, one slot, with deferred tasks counted.
POOL = {"name": GPU_POOL, "slots": 1, "description": "gpuflow: GPU jobs start one at a time", "include_deferred": True}


class DeployRefused(RuntimeError):
    """The environment cannot take gpuflow as it is; the message names the fix. Nothing was changed."""


class ComposerDeployment:
    def __init__(self, target: ComposerTarget, say: Callable[[str], None] = print):
        self.target, self.say = target, say

    def _hook(self):
        return self.target.hook()

    def environment(self):
        return self._hook().get_environment(**self.target.where())

    def deploy(self, config_file: Path | None = None, dry_run: bool = False) -> dict[str, Any]:
        """Every step in order; the first refusal stops it before anything is written."""
        environment = self.environment()
        software = environment.config.software_config
        self.say(f"environment {environment.name}: image {software.image_version}")
        problem = image_too_old(software.image_version)
        if problem:
            raise DeployRefused(problem)
        if config_file is not None and not Path(config_file).is_file():
            raise DeployRefused(f"--config {config_file} is no file. Fix: name your gcp configuration (a copy of "
                                "configs/gcp.example.yaml)")
        bucket = environment.config.dag_gcs_prefix.removeprefix("gs://").split("/", 1)[0]
        summary = {"image": software.image_version, "bucket": bucket,
                   "files": self._files(bucket, dry_run), "packages": self._packages(dict(software.pypi_packages),
                                                                                    dry_run),
                   "pool": self._pool(environment.config.airflow_uri, dry_run)}
        if config_file is not None:
            summary["config"] = self._config(bucket, Path(config_file), dry_run)
        self.say("dry run: nothing was changed" if dry_run else "deployed")
        return summary

    def _files(self, bucket: str, dry_run: bool) -> dict[str, Any]:
        from airflow.providers.google.cloud.hooks.gcs import GCSHook

        gcs = GCSHook(gcp_conn_id=self.target.conn_id)
        files = deploy_files()
        previous = json.loads(gcs.download(bucket, MANIFEST)) if gcs.exists(bucket, MANIFEST) else []
        stale = stale_files(previous, files)
        self.say(f"copy {len(files)} files to gs://{bucket}/ (dags/, plugins/gpuflow/, data/); remove "
                 f"{len(stale)} that an earlier gpuflow deploy copied and this one does not ship"
                 + "".join(f"\n  remove {name}" for name in stale))
        if not dry_run:
            for name, path in files.items():
                gcs.upload(bucket, name, filename=str(path))
            for name in stale:
                gcs.delete(bucket, name)
            gcs.upload(bucket, MANIFEST, data=json.dumps(sorted(files), indent=1))
        return {"copied": len(files), "removed": stale}

    def _packages(self, current: dict[str, str], dry_run: bool) -> dict[str, Any]:
        plan = merged_packages(current, composer_ranges())
        self.say("PyPI packages: " + ("; ".join(plan.describe()) or "nothing to change")
                 + f"; the environment's other {len(current) - len(plan.raised) - len(plan.kept)} stay as they are")
        if plan.changes and not dry_run:
            # The mask Composer's environments.patch reference names for "replace all custom PyPI packages"
            # (docs.cloud.google.com/composer/docs/reference/rest/v1/projects.locations.environments/patch).
            self._hook().update_environment(
                **self.target.where(), environment={"config": {"software_config": {"pypi_packages": plan.packages}}},
                update_mask={"paths": ["config.softwareConfig.pypiPackages"]})
            self.say("the packages install in the environment's update, which Composer runs for minutes")
        return {"added": plan.added, "raised": plan.raised, "kept": plan.kept}

    def _pool(self, airflow_uri: str, dry_run: bool) -> str:
        hook = self._hook()
        found = read_pool(hook, airflow_uri, POOL["name"])
        if found.status_code == 200:
            self.say(f"pool {POOL['name']}: exists ({found.json().get('slots')} slots); left as it is")
            return "exists"
        if found.status_code != 404:
            raise DeployRefused(f"reading the pool {POOL['name']} through the Airflow REST API failed "
                                f"({found.status_code}: {found.text[:200]}). Fix: the deploying identity needs "
                                "access to the environment's Airflow UI (roles/composer.user)")
        self.say(f"pool {POOL['name']}: create it ({POOL['slots']} slot, deferred tasks counted)")
        if dry_run:
            return "to create"
        made = hook.make_composer_airflow_api_request("POST", airflow_uri, "/api/v2/pools", data=json.dumps(POOL))
        if made.status_code not in (200, 201):
            raise DeployRefused(f"creating the pool {POOL['name']} failed ({made.status_code}: {made.text[:200]})")
        return "created"

    def _config(self, bucket: str, config_file: Path, dry_run: bool) -> str:
        from airflow.providers.google.cloud.hooks.gcs import GCSHook

        from gpuflow.config import ConfigError
        from gpuflow.config_loading import load_config

        try:
            config = load_config(config_file)
        except ConfigError as error:
            raise DeployRefused(f"--config {config_file}: {error}") from None
        if not config.traits.dataflow_workers:  # the jobs run on Google Cloud, not on the Airflow worker
            raise DeployRefused(f"--config {config_file} runs the {config.profile} profile; on Composer the DAGs "
                                "need profile: gcp. Fix: start from configs/gcp.example.yaml")
        target = f"data/{SITE_CONFIG}"
        self.say(f"the DAGs' default configuration: {config_file} -> gs://{bucket}/{target}")
        if not dry_run:
            GCSHook(gcp_conn_id=self.target.conn_id).upload(bucket, target, filename=str(config_file))
        return target
