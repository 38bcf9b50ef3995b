"""Where gpuflow's project files lie. No third-party imports: DAG files use it while they are parsed."""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def project_path(relative: str) -> Path:
    """A project folder or file: beside plugins/ in a checkout, or under data/ where Cloud Composer puts it.

    Composer mounts its bucket at /home/airflow/gcs with dags/, plugins/ and data/ side by side, so
    PROJECT_ROOT is /home/airflow/gcs there and the files deployed to data/ are found under it.
    """
    candidates = (PROJECT_ROOT / relative, PROJECT_ROOT / "data" / relative)
    return next((path for path in candidates if path.exists()), candidates[0])


#: The deployment's folder of site files, relative to the project (under data/ on Composer, where
#: ``gpuflow deploy-composer --config`` puts each team's): no repository file lies there, so a redeploy never
#: overwrites one.
SITE_FOLDER = "site"
#: The environment variable that moves the deployment's site folder elsewhere: the Airflow deployment's environment,
#: which its deployment manager sets and no run can (docs/security.md).
SITE_DIR_VARIABLE = "GPUFLOW_SITE_DIR"


def site_dir() -> Path:
    """The deployment's folder of configuration files: $GPUFLOW_SITE_DIR, else site/ (data/site/ on Composer)."""
    configured = os.environ.get(SITE_DIR_VARIABLE)
    return Path(configured) if configured else project_path(SITE_FOLDER)


def resolve_config_path(config_file: str | Path | None, default: str = "configs/local.yaml") -> Path:
    """Relative paths are looked up in the working directory, then in the project root."""
    path = Path(config_file or project_path(default))
    if path.is_absolute() or path.exists():
        return path
    return project_path(str(path))
