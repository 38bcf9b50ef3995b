"""Deploying gpuflow to Cloud Composer: what goes where in the environment's bucket, and the PyPI packages.

Composer mounts its bucket at /home/airflow/gcs: dags/ and plugins/ are on sys.path, and data/ holds the
files the tasks read (beam_jobs/, configs/, docker/, spark_jobs/; found through ``config.project_path``).
"""

from __future__ import annotations

import re
from pathlib import Path

from gpuflow.paths import PROJECT_ROOT

#: Project folders copied into the bucket's data/ folder.
DATA_FOLDERS = ("beam_jobs", "configs", "docker", "spark_jobs")

#: Not installed on Composer: Airflow, Beam and the providers Composer ships (it pins their versions; its Beam
#: provider needs its apache-beam, so deploy-composer never replaces it), Airflow's own dependencies, what the
#: Google provider's own dependencies bring (google-cloud-resource-manager: google-cloud-aiplatform requires it, and
#: the provider requires aiplatform, in 22.2.2 as in 22.8.0, read from their wheels' metadata), and what only the
#: local profile uses (emulators, local Spark, the model libraries, which run in the Dataflow workers and the
#: Vertex AI job, not in Airflow). The access check's other clients (service usage, IAM, org policy) are no
#: dependency of the provider, so the deploy adds them.
COMPOSER_PROVIDES_OR_NOT_NEEDED = {
    "apache-airflow", "apache-airflow-providers-google", "apache-airflow-providers-apache-beam", "apache-beam",
    "google-cloud-resource-manager", "pydantic",
    "pyyaml", "gcp-storage-emulator", "pyspark", "torch", "transformers", "tokenizers", "safetensors",
}


def composer_requirements(requirements: Path | None = None) -> list[str]:
    """requirements.txt without what Composer provides or does not need, pins kept."""
    lines = (requirements or PROJECT_ROOT / "requirements.txt").read_text().splitlines()
    wanted = []
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        name = re.split(r"[\[=<>!~ ]", line, maxsplit=1)[0].lower()
        if name not in COMPOSER_PROVIDES_OR_NOT_NEEDED:
            wanted.append(line)
    return wanted


def deploy_commands(environment: str, location: str, requirements_file: Path) -> list[list[str]]:
    """The gcloud commands that deploy gpuflow into a Composer environment, in order."""
    where = [f"--environment={environment}", f"--location={location}"]
    storage = ["gcloud", "composer", "environments", "storage"]
    # One command per DAG file: importing the folder would nest it as dags/dags/.
    commands = [[*storage, "dags", "import", *where, f"--source={dag_file}"]
                for dag_file in sorted((PROJECT_ROOT / "dags").glob("*.py"))]
    commands.append([*storage, "plugins", "import", *where, f"--source={PROJECT_ROOT / 'plugins' / 'gpuflow'}"])
    commands += [[*storage, "data", "import", *where, f"--source={PROJECT_ROOT / folder}"] for folder in DATA_FOLDERS]
    commands.append(["gcloud", "composer", "environments", "update", environment, f"--location={location}",
                     f"--update-pypi-packages-from-file={requirements_file}"])
    return commands
