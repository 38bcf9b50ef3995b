"""Container recipes: render a build context from docker/, and check it statically.

A real build needs a Docker engine (local) or Cloud Build (gcp); this module only renders and reads.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuflow import catalog
from gpuflow.configuration.loading import beam_jobs_dir
from gpuflow.configuration.model import ConfigError, GpuflowConfig
from gpuflow.images.locks import Lock, lock_path, read_lock
from gpuflow.paths import project_path

RECIPES_DIR = project_path("docker")
BEAM_BOOT = "/opt/apache/beam/boot"
NVIDIA_LIBS = "/usr/local/nvidia/lib64"
#: The lock's name in the build context; every recipe installs it with pip --require-hashes.
LOCK_IN_CONTEXT = "worker-requirements.lock"
_DRIVER_INSTALL = re.compile(r"(nvidia-driver|cuda-drivers|NVIDIA-Linux-.*\.run|nvidia-utils-\d+)", re.IGNORECASE)


def recipe_names() -> list[str]:
    return sorted(path.stem for path in RECIPES_DIR.glob("*.Dockerfile"))


@dataclass(frozen=True)
class RecipeMetadata:
    """The ``# gpuflow-recipe:`` header of a recipe: its label, checked against its lock, and its lock's name."""

    name: str
    cuda_major: int | None  # the CUDA line the recipe is labelled for; None: a CPU recipe
    min_beam: str | None
    lock: str
    also_cuda: tuple[int, ...] = ()  # other CUDA lines the label admits, each said in the recipe's comment


def recipe_metadata(recipe: str) -> RecipeMetadata:
    path = RECIPES_DIR / f"{recipe}.Dockerfile"
    header = path.read_text().splitlines()[0]
    if not header.startswith("# gpuflow-recipe:"):
        raise ValueError(f"{path} lacks its '# gpuflow-recipe: cuda=N|none min_beam=X lock=NAME' header")
    fields = dict(item.split("=", 1) for item in header.split(":", 1)[1].split())
    cuda = None if fields["cuda"] == "none" else int(fields["cuda"])
    also = tuple(int(line) for line in fields["also_cuda"].split(",")) if "also_cuda" in fields else ()
    return RecipeMetadata(recipe, cuda, fields.get("min_beam"), fields["lock"], also)


def recipe_lock(recipe: str) -> Lock:
    return read_lock(recipe_metadata(recipe).lock)


def image_cuda(config: GpuflowConfig) -> int | None:
    """The CUDA line of the image gpuflow builds, read from its recipe's lock; None for container.image or CPU."""
    return None if config.container.image else recipe_lock(config.recipe).cuda_line


def lock_target_problems(config: GpuflowConfig, lock: Lock) -> list[tuple[str, str]]:
    """(problem, fix) pairs: a lock resolved for another Python or Beam than the image gets installs wrong wheels."""
    problems = []
    if lock.python != config.python_version:
        problems.append((f"docker/locks/{lock.name}.lock is resolved for Python {lock.python}, and python_version is "
                         f"{config.python_version}", f"set python_version: {lock.python}, or run "
                         f"`make lock PYTHON_VERSION={config.python_version}`"))
    if lock.beam and lock.beam != config.beam_version:
        problems.append((f"docker/locks/{lock.name}.lock pins Beam {lock.beam}, and beam_version is "
                         f"{config.beam_version}", f"set beam_version: {lock.beam}, or run "
                         f"`make lock BEAM_VERSION={config.beam_version}`"))
    return problems


def render_recipe(config: GpuflowConfig, output_dir: Path, recipe: str | None = None) -> Path:
    """Write Dockerfile, worker-requirements.lock and beam_jobs/ into ``output_dir``; return the Dockerfile."""
    recipe = recipe or config.recipe
    template_path = RECIPES_DIR / f"{recipe}.Dockerfile"
    if not template_path.exists():
        raise ConfigError(f"container.recipe {recipe!r} does not exist. Fix: use one of {recipe_names()}.")
    problems = lock_target_problems(config, recipe_lock(recipe))
    if problems:
        raise ConfigError("; ".join(f"{problem}. Fix: {fix}" for problem, fix in problems))
    output_dir.mkdir(parents=True, exist_ok=True)
    dockerfile = output_dir / "Dockerfile"
    text = string.Template(template_path.read_text()).substitute(
        python_version=config.python_version, beam_version=config.beam_version
    )
    if config.launch_mode == "flex_template":
        text = text.replace("\nENTRYPOINT", flex_launcher_lines(config) + "\nENTRYPOINT", 1)
    dockerfile.write_text(text)
    shutil.copyfile(lock_path(recipe_metadata(recipe).lock), output_dir / LOCK_IN_CONTEXT)
    shutil.copytree(beam_jobs_dir(), output_dir / "beam_jobs", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dockerfile


#: Where the recipes put beam_jobs/ in the image, and the file the Flex Template launcher runs.
IMAGE_BEAM_JOBS = "/opt/gpuflow/beam_jobs"
FLEX_MAIN = f"{IMAGE_BEAM_JOBS}/flex_main.py"
FLEX_LAUNCHER = "/opt/google/dataflow/python_template_launcher"


def flex_launcher_base(config: GpuflowConfig) -> str:
    return f"gcr.io/dataflow-templates-base/python{config.python_version.replace('.', '')}-template-launcher-base"


FLEX_LAUNCHER_TAGS_PAGE = "https://cloud.google.com/dataflow/docs/reference/flex-templates-base-images"


def flex_launcher_tag(config: GpuflowConfig) -> str | None:
    """container.flex_launcher_tag, or the tag catalog/images.yaml pins (with its source) for python_version."""
    from gpuflow.catalog import flex_launcher_tag as pinned

    return config.container.flex_launcher_tag or pinned(config.python_version)


def flex_launcher_problem(config: GpuflowConfig) -> tuple[str, str] | None:
    """(problem, fix): the launcher image must be pinned like every other input of a content-tagged image; gpuflow
    cannot read the page's current tag from its build machines, so the catalog or the configuration names it."""
    tag = flex_launcher_tag(config)
    if config.launch_mode != "flex_template" or (tag and tag != "latest"):
        return None
    return (f"launch.mode flex_template copies its launcher from {flex_launcher_base(config)}, and "
            f"container.flex_launcher_tag is " + ("latest" if tag else
                                                 f"empty and catalog/images.yaml pins none for Python "
                                                 f"{config.python_version}"),
            f"set container.flex_launcher_tag to the newest tag in the Python table of {FLEX_LAUNCHER_TAGS_PAGE}")


def flex_launcher_lines(config: GpuflowConfig) -> str:
    """launch.mode: flex_template: the worker image is its own launcher, so its Beam and Python launch the job."""
    problem = flex_launcher_problem(config)
    if problem:
        raise ConfigError(f"{problem[0]}. Fix: {problem[1]}")
    return (
        "\n# launch.mode: flex_template. Dataflow starts this same image with the Flex Template launcher, which runs\n"
        "# flex_main.py; the job is therefore pickled by the workers' own Beam and Python.\n"
        f"COPY --from={flex_launcher_base(config)}:{flex_launcher_tag(config)} {FLEX_LAUNCHER} "
        f"{FLEX_LAUNCHER}\n"
        f"ENV FLEX_TEMPLATE_PYTHON_PY_FILE={FLEX_MAIN}\n"
        f"ENV PYTHONPATH={IMAGE_BEAM_JOBS}\n"
    )


def context_digest(context_dir: Path) -> str:
    """A tag derived from the build context's content, so an unchanged context is never rebuilt."""
    digest = hashlib.sha256()
    for path in sorted(p for p in context_dir.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(context_dir)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _labelled_cuda(dockerfile: Path) -> int | None:
    """The CUDA line of the recipe header the rendered Dockerfile keeps on its first line."""
    header = dockerfile.read_text().splitlines()[0]
    found = re.search(r"\bcuda=(\w+)", header) if header.startswith("# gpuflow-recipe:") else None
    return None if found is None or found[1] == "none" else int(found[1])


def _install_problems(runs: str) -> list[str]:
    """Everything pip installs comes from the lock, hash-checked; any other install makes the content tag lie."""
    installs = [part.strip() for part in re.split(r"&&|;", runs) if re.search(r"\bpip install\b", part)]
    problems = []
    if not any(LOCK_IN_CONTEXT in part and "--require-hashes" in part for part in installs):
        problems.append(f"does not install {LOCK_IN_CONTEXT} with pip --require-hashes")
    problems += [f"installs what no lock pins: `{part}`" for part in installs if LOCK_IN_CONTEXT not in part]
    return problems


def _base_image_problems(instructions: list[dict[str, Any]], text: str) -> list[str]:
    """Every image the build starts from or copies from is pinned to a tag (never latest); a missing digest is said."""
    images = [i["value"].split()[0] for i in instructions if i["instruction"] == "FROM"]
    images += [found[1] for i in instructions if i["instruction"] == "COPY"
               and (found := re.search(r"--from=(\S+)", i["value"]))]
    problems = []
    for image in images:
        tag = image.partition("@")[0].rpartition("/")[2].partition(":")[2]
        if not tag or tag == "latest":
            problems.append(f"{image} is not pinned to a tag (never latest): the same content tag would hold "
                            "different builds")
    if any("@sha256:" not in image for image in images) and "not their digests" not in text:
        problems.append("a base image has no digest, and the recipe does not say why")
    return problems


def check_dockerfile(dockerfile: Path, config: GpuflowConfig) -> list[str]:
    """Problems that would break a Beam worker or make its image's content tag lie, read from the Dockerfile alone."""
    from dockerfile_parse import DockerfileParser

    parser = DockerfileParser(path=str(dockerfile))
    instructions = parser.structure
    beam_image = f"apache/beam_python{config.python_version}_sdk:{config.beam_version}"
    froms = [i["value"].split()[0] for i in instructions if i["instruction"] == "FROM"]
    copies_boot = any(
        i["instruction"] == "COPY" and f"--from={beam_image}" in i["value"] and "/opt/apache/beam" in i["value"]
        for i in instructions
    )
    problems = []
    if not froms:
        problems.append("no FROM instruction")
    if beam_image not in froms and not copies_boot:
        problems.append(f"neither starts from nor copies /opt/apache/beam from {beam_image}")
    entrypoints = [i["value"] for i in instructions if i["instruction"] == "ENTRYPOINT"]
    if (entrypoints and BEAM_BOOT not in entrypoints[-1]) or (not entrypoints and froms and froms[-1] != beam_image):
        problems.append(f'the entrypoint must be ["{BEAM_BOOT}"] (or inherited from the Beam SDK image)')
    runs = " ".join(i["value"] for i in instructions if i["instruction"] == "RUN")
    if "pip check" not in runs:
        problems.append("no `pip check` after the installs")
    if _DRIVER_INSTALL.search(runs):
        problems.append("installs a GPU driver; Dataflow installs the driver on the host (install-nvidia-driver)")
    problems += _install_problems(runs) + _base_image_problems(instructions, dockerfile.read_text())
    env = " ".join(i["value"] for i in instructions if i["instruction"] == "ENV")
    if _labelled_cuda(dockerfile) is not None and NVIDIA_LIBS not in env:
        problems.append(f"LD_LIBRARY_PATH does not include {NVIDIA_LIBS}, where Dataflow mounts the driver")
    if f"PYTHONPATH={IMAGE_BEAM_JOBS}" not in env:
        problems.append(f"PYTHONPATH does not include {IMAGE_BEAM_JOBS}, where the pipeline's functions import "
                        "its modules (prompt_io, llm_handlers, llm_models) from")
    if config.launch_mode == "flex_template":
        copies = " ".join(i["value"] for i in instructions if i["instruction"] == "COPY")
        if FLEX_LAUNCHER not in copies or f"FLEX_TEMPLATE_PYTHON_PY_FILE={FLEX_MAIN}" not in env:
            problems.append(f"launch.mode flex_template needs {FLEX_LAUNCHER} from {flex_launcher_base(config)} "
                            f"and FLEX_TEMPLATE_PYTHON_PY_FILE={FLEX_MAIN}")
    return problems


#: The export job's lock (docker/locks/export.lock), installed in Vertex AI's prebuilt image on its own torch.
EXPORT_LOCK = "export"


def export_image_target(config: GpuflowConfig) -> tuple[str, str]:
    """(torch, Python) of the export image, read from its name; ConfigError for an image whose name does not say
    both (the export's lock is resolved for that Python)."""
    versions = catalog.export_image_versions(config.export.container_image)
    if versions is None or versions[1] is None:
        raise ConfigError(f"export.container_image {config.export.container_image} is not one of Vertex AI's prebuilt "
                          "PyTorch images (pytorch-cpu.X-Y.pyXY), so gpuflow cannot tell its torch and Python. Fix: "
                          "use one of them, from cloud.google.com/vertex-ai/docs/training/pre-built-containers.")
    return versions[0], versions[1]


def lock_targets(config: GpuflowConfig) -> dict[str, tuple[str, str | None]]:
    """Each lock's (Python, Beam): the workers' from the configuration, the export's from its image."""
    targets: dict[str, tuple[str, str | None]] = {
        recipe_metadata(recipe).lock: (config.python_version, config.beam_version) for recipe in recipe_names()}
    targets[EXPORT_LOCK] = (export_image_target(config)[1], None)
    return targets


def recipe_rows() -> list[dict[str, str]]:
    """What each recipe installs, read from its lock: docs/gpus.md's recipe table and `gpuflow recipes`."""
    rows = []
    for recipe in recipe_names():
        meta, lock = recipe_metadata(recipe), recipe_lock(recipe)
        rows.append({
            "recipe": recipe, "lock": f"docker/locks/{lock.name}.lock", "python": lock.python,
            "torch": lock.torch or "-", "transformers": lock.packages.get("transformers", "-"),
            "cuda": f"CUDA {lock.cuda_line}" if lock.cuda_line else "none (CPU)",
            "driver": f">= {lock.driver_need}" if lock.driver_need else "none",
            "beam": f">= {meta.min_beam}" if meta.min_beam else "any"})
    return rows


def recipe_table() -> str:
    """The recipe table of docs/gpus.md and `gpuflow recipes`, read from the locks."""
    lines = ["| recipe | lock | Python | torch | transformers | CUDA line | driver needed | Beam |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['recipe']} | `{r['lock']}` | {r['python']} | {r['torch']} | {r['transformers']} | {r['cuda']} | "
              f"{r['driver']} | {r['beam']} |" for r in recipe_rows()]
    return "\n".join(lines)
