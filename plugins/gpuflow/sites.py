"""A site: one configuration file and the DAGs made from it, in a DAG folder of their own (``dags/<site>/``).

Each team's configuration file gives its own set of DAGs, named after the file (``team-a.yaml``: ``team-a__…``
DAG ids, the tag ``site:team-a``), so that one Airflow can give each team a role on its own folder's DAGs
(docs/security.md) and no run can pick another team's file: the file is fixed when the DAG file is parsed, and a
run's conf names none. The DAG file a site gets is small and generated (``site_dag_file_text``): ``gpuflow site-dags``
writes it for a self-run Airflow, ``gpuflow deploy-composer --config`` into the environment's bucket.

No third-party imports: the DAG files use it while they are parsed.
"""

from __future__ import annotations

import re
from pathlib import Path

#: A site's name: its configuration file's stem, usable in DAG ids, tags, labels and Pub/Sub names.
SITE_NAME = re.compile(r"[a-z][a-z0-9_-]{0,30}")
#: The DAG file each site folder holds (``dags/<site>/gpuflow_site.py``).
SITE_DAG_FILE = "gpuflow_site.py"
#: The airflow.* modules gpuflow's DAGs import: a DAG file names them so that the dag-processor imports them once,
#: before it forks each parse ([dag_processor] parsing_pre_import_modules reads a file's own imports only).
PRE_IMPORTED = (
    "airflow.providers.google.cloud.operators.dataproc",
    "airflow.providers.google.cloud.sensors.gcs",
    "airflow.sdk",
)


class SiteNameError(ValueError):
    """A configuration file whose stem cannot name a site."""


def site_name(config_file: str | Path) -> str:
    """The site a configuration file makes: its stem, checked against ``SITE_NAME``."""
    name = Path(config_file).stem
    if not SITE_NAME.fullmatch(name):
        raise SiteNameError(
            f"the configuration file {str(config_file)!r} cannot name a site: its name {name!r} is not of the form "
            f"{SITE_NAME.pattern} (a lowercase letter, then up to 30 lowercase letters, digits, '_' or '-'), which "
            "DAG ids, labels and Pub/Sub names all accept. Fix: rename the file, e.g. team-a.yaml.")
    return name


def site_dag_id(site: str | None, dag_name: str) -> str:
    """A DAG's id: gpuflow's name for it, after its site's (none: the repository's own local DAGs)."""
    return f"{site}__{dag_name}" if site else dag_name


def has_site_folders(dags_folder: Path) -> bool:
    """Whether a DAG folder holds site folders (``<site>/gpuflow_site.py``): they replace the repository's own
    local DAGs, which read configs/local.yaml."""
    return any(dags_folder.glob(f"*/{SITE_DAG_FILE}"))


def site_dag_file_text(config_reference: str) -> str:
    """The DAG file of the site whose configuration file is ``config_reference`` (a path as the parse will read
    it: absolute, or relative to the project root, such as Composer's ``site/team-a.yaml`` under data/)."""
    name = site_name(config_reference)
    imports = "".join(f"import {module}  # noqa: F401\n" for module in PRE_IMPORTED)
    return (f'"""gpuflow\'s Airflow DAGs of the site {name}, made from {config_reference}.\n\n'
            "Written by `gpuflow site-dags` (or `gpuflow deploy-composer --config`): write it again rather than edit "
            'it."""\n\n'
            "# The airflow.* modules the DAGs use, imported once by the dag-processor before it forks each parse.\n"
            f"{imports}"
            "from gpuflow.site_dags import site_dags\n\n"
            f"globals().update(site_dags({config_reference!r}))\n")


def write_site_dag_file(config_file: Path, dags_folder: Path, config_reference: str | None = None) -> Path:
    """Write ``dags_folder/<site>/gpuflow_site.py`` for ``config_file``; its path."""
    reference = config_reference or str(config_file.resolve())
    target = dags_folder / site_name(config_file) / SITE_DAG_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(site_dag_file_text(reference))
    return target
