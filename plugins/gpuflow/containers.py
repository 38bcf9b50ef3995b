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

from gpuflow.config import ConfigError, GpuflowConfig, beam_jobs_dir, project_path

RECIPES_DIR = project_path("docker")
BEAM_BOOT = "/opt/apache/beam/boot"
NVIDIA_LIBS = "/usr/local/nvidia/lib64"
_DRIVER_INSTALL = re.compile(r"(nvidia-driver|cuda-drivers|NVIDIA-Linux-.*\.run|nvidia-utils-\d+)", re.IGNORECASE)


def recipe_names() -> list[str]:
    return sorted(path.stem for path in RECIPES_DIR.glob("*.Dockerfile"))


@dataclass(frozen=True)
class RecipeMetadata:
    """The ``# gpuflow-recipe:`` header of a recipe: what preflight needs to know without building it."""

    name: str
    cuda_major: int
    min_beam: str | None
    torch_from: str  # "pip": the recipe installs torch; "image": the base image has it


def image_cuda(config: GpuflowConfig) -> int | None:
    """The CUDA line of the image gpuflow builds from its recipe; None for an image named in container.image."""
    return None if config.container.image else recipe_metadata(config.container.recipe).cuda_major


def recipe_metadata(recipe: str) -> RecipeMetadata:
    path = RECIPES_DIR / f"{recipe}.Dockerfile"
    header = path.read_text().splitlines()[0]
    if not header.startswith("# gpuflow-recipe:"):
        raise ValueError(f"{path} lacks its '# gpuflow-recipe: cuda=N min_beam=X torch=pip|image' header")
    fields = dict(item.split("=", 1) for item in header.split(":", 1)[1].split())
    return RecipeMetadata(recipe, int(fields["cuda"]), fields.get("min_beam"), fields.get("torch", "pip"))


#: The vllm recipe's pins, from vllm 0.32.0's wheel metadata (Requires-Dist): torch==2.13.0 (the same torch as the
#: other recipes) and transformers>=5.16.1,<5.20.0; vllm 0.33.0 moved to torch==2.14.0.
VLLM_PINS = ["vllm==0.32.0", "transformers==5.19.0"]


def worker_requirements(config: GpuflowConfig, recipe: str | None = None) -> str:
    """What the workers need on top of the base image; torch only where the image lacks it."""
    recipe = recipe or config.container.recipe
    metadata = recipe_metadata(recipe)
    torch = ["torch==2.13.0"] if metadata.torch_from == "pip" else []
    libraries = VLLM_PINS if recipe == "vllm" else ["transformers==5.24.0"]
    return "\n".join(
        [f"apache-beam[gcp]=={config.beam_version}", *torch, *libraries, "tokenizers", "safetensors",
         "google-cloud-storage", ""]
    )


def render_recipe(config: GpuflowConfig, output_dir: Path, recipe: str | None = None) -> Path:
    """Write Dockerfile, worker-requirements.txt and beam_jobs/ into ``output_dir``; return the Dockerfile."""
    recipe = recipe or config.container.recipe
    template_path = RECIPES_DIR / f"{recipe}.Dockerfile"
    if not template_path.exists():
        raise ConfigError(f"container.recipe {recipe!r} does not exist. Fix: use one of {recipe_names()}.")
    output_dir.mkdir(parents=True, exist_ok=True)
    dockerfile = output_dir / "Dockerfile"
    text = string.Template(template_path.read_text()).substitute(
        python_version=config.python_version, beam_version=config.beam_version
    )
    if config.launch.mode == "flex_template":
        text = text.replace("\nENTRYPOINT", flex_launcher_lines(config) + "\nENTRYPOINT", 1)
    dockerfile.write_text(text)
    (output_dir / "worker-requirements.txt").write_text(worker_requirements(config, recipe))
    shutil.copytree(beam_jobs_dir(), output_dir / "beam_jobs", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dockerfile


#: Where the recipes put beam_jobs/ in the image, and the file the Flex Template launcher runs.
IMAGE_BEAM_JOBS = "/opt/gpuflow/beam_jobs"
FLEX_MAIN = f"{IMAGE_BEAM_JOBS}/flex_main.py"
FLEX_LAUNCHER = "/opt/google/dataflow/python_template_launcher"


def flex_launcher_base(config: GpuflowConfig) -> str:
    return f"gcr.io/dataflow-templates-base/python{config.python_version.replace('.', '')}-template-launcher-base"


def flex_launcher_lines(config: GpuflowConfig) -> str:
    """launch.mode: flex_template: the worker image is its own launcher, so its Beam and Python launch the job."""
    return (
        "\n# launch.mode: flex_template. Dataflow starts this same image with the Flex Template launcher, which runs\n"
        "# flex_main.py; the job is therefore pickled by the workers' own Beam and Python.\n"
        f"COPY --from={flex_launcher_base(config)}:latest {FLEX_LAUNCHER} {FLEX_LAUNCHER}\n"
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


def check_dockerfile(dockerfile: Path, config: GpuflowConfig) -> list[str]:
    """Problems that would break a GPU Beam worker, read from the Dockerfile alone."""
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
    env = " ".join(i["value"] for i in instructions if i["instruction"] == "ENV")
    if NVIDIA_LIBS not in env:
        problems.append(f"LD_LIBRARY_PATH does not include {NVIDIA_LIBS}, where Dataflow mounts the driver")
    if f"PYTHONPATH={IMAGE_BEAM_JOBS}" not in env:
        problems.append(f"PYTHONPATH does not include {IMAGE_BEAM_JOBS}, where the pipeline's functions import "
                        "its modules (prompt_io, llm_handlers, llm_models) from")
    if config.launch.mode == "flex_template":
        copies = " ".join(i["value"] for i in instructions if i["instruction"] == "COPY")
        if FLEX_LAUNCHER not in copies or f"FLEX_TEMPLATE_PYTHON_PY_FILE={FLEX_MAIN}" not in env:
            problems.append(f"launch.mode flex_template needs {FLEX_LAUNCHER} from {flex_launcher_base(config)} "
                            f"and FLEX_TEMPLATE_PYTHON_PY_FILE={FLEX_MAIN}")
    return problems
