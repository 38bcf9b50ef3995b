"""A Cloud Composer environment and its Airflow REST API, through the provider's ``CloudComposerHook``: where
``deploy-composer`` creates the ``gpuflow_gpu`` pool, and where preflight, running on Composer, reads it.

Airflow 3's task execution API has no route for pools, so a task can read them only through the environment's
REST API (v2, always enabled on Airflow 3, with Composer's own authentication:
docs.cloud.google.com/composer/docs/composer-3/access-airflow-api). A task knows its environment from the
variables Composer reserves and sets in its Airflow containers: ``COMPOSER_ENVIRONMENT``, ``COMPOSER_LOCATION``
and ``GCP_PROJECT`` ("Reserved variables", docs.cloud.google.com/composer/docs/composer-3/set-environment-variables).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow.providers.google.cloud.hooks.cloud_composer import CloudComposerHook

#: Composer's reserved variables that name the environment a task runs in.
ENVIRONMENT_VARIABLES = ("COMPOSER_ENVIRONMENT", "COMPOSER_LOCATION", "GCP_PROJECT")


@dataclass
class ComposerTarget:
    environment: str
    location: str
    project: str | None = None  # None: the connection's project
    conn_id: str = "google_cloud_default"
    impersonation_chain: list[str] | None = None

    def hook(self) -> CloudComposerHook:
        from airflow.providers.google.cloud.hooks.cloud_composer import CloudComposerHook

        return CloudComposerHook(gcp_conn_id=self.conn_id, impersonation_chain=self.impersonation_chain)

    def where(self) -> dict[str, Any]:
        return {"project_id": self.project, "region": self.location, "environment_id": self.environment}


def this_environment(gcp_conn_id: str, impersonation_chain: list[str] | None = None) -> ComposerTarget | None:
    """The Composer environment this process runs in, or None elsewhere."""
    environment, location, project = (os.environ.get(name) for name in ENVIRONMENT_VARIABLES)
    if not (environment and location):
        return None
    return ComposerTarget(environment, location, project or None, gcp_conn_id, impersonation_chain)


def environment_facts(target: ComposerTarget) -> dict[str, Any]:
    """What preflight reads of the environment it runs in: its image version and how many triggerers it has
    (``WorkloadsConfig.triggerer.count`` in Composer's environments API; None where the environment states none),
    or ``problem``: why it could not be read."""
    try:
        environment = target.hook().get_environment(**target.where())
    except Exception as problem:  # refused, unreachable, credentials: the check cannot tell
        return {"problem": f"{type(problem).__name__}: {str(problem)[:200]}"}
    config = environment.config
    workloads = config.workloads_config if "workloads_config" in config else None
    triggerers = workloads.triggerer.count if workloads is not None and "triggerer" in workloads else None
    return {"image": config.software_config.image_version, "triggerers": triggerers}


def read_pool(hook: CloudComposerHook, airflow_uri: str, name: str) -> Any:
    """GET /api/v2/pools/NAME on the environment's Airflow: the response (200: it exists; 404: it does not)."""
    return hook.make_composer_airflow_api_request("GET", airflow_uri, f"/api/v2/pools/{name}")


def pool_state(target: ComposerTarget, name: str) -> tuple[str, str]:
    """("exists" | "missing" | "unknown", what was read), for preflight."""
    try:
        hook = target.hook()
        environment = hook.get_environment(**target.where())
        found = read_pool(hook, environment.config.airflow_uri, name)
    except Exception as problem:  # refused, unreachable, credentials: the check cannot tell
        return "unknown", f"{type(problem).__name__}: {str(problem)[:200]}"
    if found.status_code == 200:
        return "exists", f"{found.json().get('slots')} slots"
    if found.status_code == 404:
        return "missing", "404 from the Airflow REST API"
    return "unknown", f"{found.status_code}: {found.text[:200]}"
