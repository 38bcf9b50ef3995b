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
- ``--config``: the team's configuration becomes a site (``gpuflow.sites``): the file goes to data/site/<site>.yaml
  and its DAG file to dags/<site>/gpuflow_site.py, whose DAGs (``<site>__…``) replace the repository's own local
  ones. Neither is in the manifest, so a redeploy without ``--config`` never touches a team's site.

Check everything, then write, then wait: the image floor, ``--config`` (a gcp configuration whose configuration
rules pass, as ``gpuflow preflight --config-only``), the package plan and the Airflow REST API (the pool's state) are
read first, and a refusal there has changed nothing. Then the files and ``--config`` are copied, the package update
is sent and waited for (Composer runs it for minutes; a failed one is reported with its error, and Composer keeps
the previous package list), and only then is the pool created. A dry run reads and prints, and writes nothing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuflow.composer.api import ComposerTarget, read_pool
from gpuflow.composer.contents import (
    MANIFEST,
    composer_ranges,
    deploy_files,
    image_too_old,
    merged_packages,
    stale_files,
)
from gpuflow.paths import SITE_FOLDER
from gpuflow.sites import SITE_DAG_FILE, SiteNameError, site_dag_file_text, site_name
from gpuflow.workflow_names import GPU_POOL

if TYPE_CHECKING:
    from airflow.providers.google.cloud.hooks.cloud_composer import CloudComposerHook
    from google.cloud.orchestration.airflow.service_v1 import Environment

    from gpuflow.composer.contents import PackagePlan
    from gpuflow.configuration.model import GpuflowConfig

log = logging.getLogger(__name__)

#: The Airflow pool of the tasks that start GPU jobs, one slot, with deferred tasks counted.
POOL = {"name": GPU_POOL, "slots": 1, "description": "gpuflow: GPU jobs start one at a time", "include_deferred": True}


class DeployRefused(RuntimeError):
    """The environment cannot take gpuflow as it is; the message names the fix. Nothing was changed."""


class DeployFailed(RuntimeError):
    """A write the deploy had started did not succeed; the message says what was changed and names the fix."""


#: How long deploy-composer waits for the environment's package update (an environment update runs for minutes;
#: Composer's "Install Python dependencies" page: docs.cloud.google.com/composer/docs/composer-3/install-python-dependencies).
UPDATE_TIMEOUT_S = 3600


class ComposerDeployment:
    def __init__(self, target: ComposerTarget, say: Callable[[str], None] = print):
        self.target, self.say = target, say

    def _hook(self) -> CloudComposerHook:
        return self.target.hook()

    def environment(self) -> Environment:
        return self._hook().get_environment(**self.target.where())

    def deploy(self, config_file: Path | None = None, dry_run: bool = False) -> dict[str, Any]:
        """Check everything, then write, then wait (the module's docstring): a refusal comes before any write."""
        environment = self.environment()
        software = environment.config.software_config
        self.say(f"environment {environment.name}: image {software.image_version}")
        problem = image_too_old(software.image_version)
        if problem:
            raise DeployRefused(problem)
        if config_file is not None:
            self._checked_config(Path(config_file))
        current = dict(software.pypi_packages)
        plan = merged_packages(current, composer_ranges())
        pool = self._pool_state(environment.config.airflow_uri)
        bucket = environment.config.dag_gcs_prefix.removeprefix("gs://").split("/", 1)[0]
        summary: dict[str, Any] = {"image": software.image_version, "bucket": bucket,
                                   "files": self._files(bucket, dry_run)}
        if config_file is not None:
            summary["config"] = self._config(bucket, Path(config_file), dry_run)
        summary["packages"] = self._packages(plan, len(current), dry_run)
        summary["pool"] = self._pool(environment.config.airflow_uri, pool, dry_run)
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

    def _packages(self, plan: PackagePlan, current_count: int, dry_run: bool) -> dict[str, Any]:
        self.say("PyPI packages: " + ("; ".join(plan.describe()) or "nothing to change")
                 + f"; the environment's other {current_count - len(plan.raised) - len(plan.kept)} stay as they are")
        if plan.changes and not dry_run:
            hook = self._hook()
            # The mask Composer's environments.patch reference names for "replace all custom PyPI packages"
            # (docs.cloud.google.com/composer/docs/reference/rest/v1/projects.locations.environments/patch).
            operation = hook.update_environment(
                **self.target.where(), environment={"config": {"software_config": {"pypi_packages": plan.packages}}},
                update_mask={"paths": ["config.softwareConfig.pypiPackages"]})
            self.say(f"waiting for the environment's update, which installs the packages (minutes; up to "
                     f"{UPDATE_TIMEOUT_S // 60} min)")
            try:
                hook.wait_for_operation(operation, timeout=UPDATE_TIMEOUT_S)
            except Exception as error:  # the provider wraps the operation's error (its __cause__) in its own
                cause = error.__cause__ or error
                raise DeployFailed(
                    f"the environment's package update failed: {cause}. Composer keeps the previous package list; "
                    "gpuflow's files were copied, and the pool was not created. Fix: resolve the conflict it names "
                    "(a package the environment pins differently), then deploy again") from None
            self.say("the environment's update finished: the packages are installed")
        return {"added": plan.added, "raised": plan.raised, "kept": plan.kept}

    def _pool_state(self, airflow_uri: str) -> str:
        """Whether the pool exists, read through the environment's Airflow REST API before anything is written: a
        deploying identity that cannot reach that API is refused here."""
        found = read_pool(self._hook(), airflow_uri, GPU_POOL)
        if found.status_code == 200:
            self.say(f"pool {POOL['name']}: exists ({found.json().get('slots')} slots); left as it is")
            return "exists"
        if found.status_code != 404:
            raise DeployRefused(f"reading the pool {POOL['name']} through the Airflow REST API failed "
                                f"({found.status_code}: {found.text[:200]}). Fix: the deploying identity needs "
                                "access to the environment's Airflow UI (roles/composer.user)")
        return "missing"

    def _pool(self, airflow_uri: str, state: str, dry_run: bool) -> str:
        """The pool, created once the package update has finished (its POST goes to the Airflow the update
        restarts)."""
        if state == "exists":
            return "exists"
        self.say(f"pool {POOL['name']}: create it ({POOL['slots']} slot, deferred tasks counted)")
        if dry_run:
            return "to create"
        made = self._hook().make_composer_airflow_api_request("POST", airflow_uri, "/api/v2/pools",
                                                              data=json.dumps(POOL))
        if made.status_code not in (200, 201):
            raise DeployFailed(f"creating the pool {POOL['name']} failed ({made.status_code}: {made.text[:200]}); "
                               "the files and packages are deployed. Fix: create it as docs/gcp.md says, or "
                               "deploy again")
        return "created"

    def _checked_config(self, config_file: Path) -> GpuflowConfig:
        """``--config`` as a gcp configuration whose configuration rules pass (``gpuflow preflight --config-only``)."""
        from gpuflow.configuration.loading import load_config
        from gpuflow.configuration.model import ConfigError
        from gpuflow.preflight import format_findings, has_errors, run_preflight

        if not config_file.is_file():
            raise DeployRefused(f"--config {config_file} is no file. Fix: name your gcp configuration (a copy of "
                                "configs/gcp.example.yaml)")
        try:
            site_name(config_file)
        except SiteNameError as error:
            raise DeployRefused(f"--config: {error}") from None
        try:
            config = load_config(config_file)
        except ConfigError as error:
            raise DeployRefused(f"--config {config_file}: {error}") from None
        if not config.traits.dataflow_workers:  # the jobs run on Google Cloud, not on the Airflow worker
            raise DeployRefused(f"--config {config_file} runs the {config.profile} profile; on Composer the DAGs "
                                "need profile: gcp. Fix: start from configs/gcp.example.yaml")
        findings = run_preflight(config, check_environment=False)
        if has_errors(findings):
            raise DeployRefused(f"--config {config_file} does not pass preflight's configuration rules:\n"
                                f"{format_findings(findings)}\nFix: `gpuflow preflight --config-only --config "
                                f"{config_file}` names each problem's fix")
        return config

    def _config(self, bucket: str, config_file: Path, dry_run: bool) -> dict[str, str]:
        """The team's site: its configuration file under data/site/, then the DAG file that makes its DAGs."""
        from airflow.providers.google.cloud.hooks.gcs import GCSHook

        site = site_name(config_file)
        reference = f"{SITE_FOLDER}/{config_file.name}"  # as the DAG file reads it: under data/ on Composer
        targets = {"config": f"data/{reference}", "dag_file": f"dags/{site}/{SITE_DAG_FILE}"}
        self.say(f"site {site}: {config_file} -> gs://{bucket}/{targets['config']}, its DAGs ({site}__…) from "
                 f"gs://{bucket}/{targets['dag_file']}")
        if not dry_run:
            gcs = GCSHook(gcp_conn_id=self.target.conn_id)
            gcs.upload(bucket, targets["config"], filename=str(config_file))
            gcs.upload(bucket, targets["dag_file"], data=site_dag_file_text(reference))
        return targets
