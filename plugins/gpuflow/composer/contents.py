"""Deploying gpuflow to Cloud Composer: what goes where in the environment's bucket, the PyPI packages, and the
image line it runs on. Pure functions; ``gpuflow.tools.deploy_composer`` talks to Composer with them.

Composer mounts its bucket at /home/airflow/gcs: dags/ and plugins/ are on sys.path, and data/ holds the
files the tasks read (beam_jobs/, configs/, docker/, spark_jobs/; found through ``config.project_path``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from gpuflow.paths import PROJECT_ROOT, SITE_FOLDER
from gpuflow.sites import SITE_DAG_FILE

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
        if package_name(line) not in COMPOSER_PROVIDES_OR_NOT_NEEDED:
            wanted.append(line)
    return wanted


# -- the image line --------------------------------------------------------------------------------

_IMAGE = re.compile(r"^composer-(?P<major>\d+)(?:\.[\d.]+)?-airflow-(?P<airflow>\d+\.\d+\.\d+)(?:-build\.\d+)?$")


def image_too_old(image_version: str) -> str | None:
    """Why the environment's image is below gpuflow's floor, with the upgrade command; None when it is not."""
    from gpuflow.catalog import composer_floor, version_tuple

    floor = composer_floor()
    wanted = floor["packages"]["apache-airflow"]
    found = _IMAGE.match(image_version)
    upgrade = (f"gcloud composer environments update ENVIRONMENT --location LOCATION "
               f"--image-version {floor['newest_image']}")
    if not found:
        return f"the image version {image_version!r} is not a Composer image name gpuflow reads. Fix: {upgrade}"
    if int(found["major"]) < floor["composer_major"]:
        # "It is not possible to upgrade from Cloud Composer 2 to Cloud Composer 3 in-place": the migration is side by
        # side (docs.cloud.google.com/composer/docs/composer-2/migrate-composer-3, "Before you begin").
        return (f"the environment runs {image_version}, Composer {found['major']}; gpuflow needs Composer "
                f"{floor['composer_major']} with Airflow {wanted} or newer, and Composer offers no in-place upgrade "
                f"from {found['major']} to {floor['composer_major']}. Fix: create a Composer {floor['composer_major']} "
                f"environment (--image-version {floor['newest_image']}), or migrate this one side by side with a "
                "snapshot (docs.cloud.google.com/composer/docs/composer-2/migrate-composer-3), then deploy there")
    if int(found["major"]) != floor["composer_major"] or version_tuple(found["airflow"]) < version_tuple(wanted):
        return (f"the environment runs {image_version}, below gpuflow's floor, Composer {floor['composer_major']} "
                f"with Airflow {wanted} (its Google provider {floor['packages']['apache-airflow-providers-google']}, "
                f"Beam provider {floor['packages']['apache-airflow-providers-apache-beam']}). Fix: {upgrade}")
    return None


# -- the PyPI packages ------------------------------------------------------------------------------

def package_name(requirement: str) -> str:
    return re.split(r"[\[=<>!~ ]", requirement.strip(), maxsplit=1)[0].lower()


def composer_ranges(requirements: list[str] | None = None) -> dict[str, str]:
    """gpuflow's packages for Composer as ranges, never pins: at least the version gpuflow is tested with, below its
    next major (``name==1.2.3`` -> ``>=1.2.3,<2``), so an environment that has a newer one keeps it."""
    ranges = {}
    for line in requirements if requirements is not None else composer_requirements():
        name, _, version = line.partition("==")
        if not version:
            ranges[package_name(line)] = line[len(package_name(line)):].strip()
            continue
        major = int(version.split(".", 1)[0])
        ranges[package_name(name)] = f">={version},<{major + 1}"
    return ranges


@dataclass
class PackagePlan:
    """The environment's custom PyPI packages after the deploy: theirs kept, gpuflow's added or raised."""

    packages: dict[str, str]
    added: dict[str, str] = field(default_factory=dict)
    raised: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (theirs, gpuflow's)
    kept: dict[str, str] = field(default_factory=dict)  # gpuflow's, already satisfied by the environment's spec

    @property
    def changes(self) -> bool:
        return bool(self.added or self.raised)

    def describe(self) -> list[str]:
        lines = [f"add {name}{spec}" for name, spec in sorted(self.added.items())]
        lines += [f"raise {name}{theirs or ' (any)'} to {name}{ours}" for name, (theirs, ours) in sorted(self.raised.items())]
        lines += [f"keep {name}{spec} (within gpuflow's range)" for name, spec in sorted(self.kept.items())]
        return lines


def merged_packages(current: dict[str, str], wanted: dict[str, str]) -> PackagePlan:
    """Every package the environment has stays; gpuflow's are added where missing, raised where the environment's
    pin lies outside gpuflow's range, and left alone where it lies inside. Composer's API replaces the whole map
    (``config.softwareConfig.pypiPackages``), so the map sent is the merged one."""
    from packaging.specifiers import SpecifierSet

    by_name = {package_name(name): name for name in current}
    plan = PackagePlan(packages=dict(current))
    for name, spec in wanted.items():
        if name not in by_name:
            plan.packages[name] = spec
            plan.added[name] = spec
            continue
        theirs = current[by_name[name]]
        pinned = re.fullmatch(r"==\s*([\w.]+)", theirs.strip())
        if theirs.strip() == spec or (pinned and pinned.group(1) in SpecifierSet(spec)):
            plan.kept[name] = theirs
        else:
            plan.packages[by_name[name]] = spec
            plan.raised[name] = (theirs, spec)
    return plan


# -- the files --------------------------------------------------------------------------------------

#: The bucket object that lists what the last deploy copied: the next one removes what it no longer ships, and
#: nothing else (a team's own DAGs, plugins and data stay).
MANIFEST = "data/gpuflow/deployed.json"


def deploy_files(root: Path = PROJECT_ROOT) -> dict[str, Path]:
    """Bucket object -> local file, laid out as Composer reads them: dags/, plugins/gpuflow/, data/<folder>/."""
    files = {f"dags/{path.name}": path for path in sorted((root / "dags").glob("*.py"))}
    sources = [("plugins/gpuflow", root / "plugins" / "gpuflow")]
    sources += [(f"data/{folder}", root / folder) for folder in DATA_FOLDERS]
    for prefix, folder in sources:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                files[f"{prefix}/{path.relative_to(folder).as_posix()}"] = path
    return files


def stale_files(previous: list[str], current: dict[str, Path]) -> list[str]:
    """What the last deploy copied and this one does not ship: only gpuflow's own, never a team's site (its file
    under data/site/, its DAG file)."""
    return sorted(name for name in previous if name not in current and not name.startswith(f"data/{SITE_FOLDER}/")
                  and not name.endswith(f"/{SITE_DAG_FILE}"))
