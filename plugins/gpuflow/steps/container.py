"""build_container: render the recipe for the configured versions, check it, build it where possible."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

from gpuflow.configuration.model import GpuflowConfig
from gpuflow.images.containers import check_dockerfile, context_digest, render_recipe
from gpuflow.platform import ImageBackend
from gpuflow.platform.base import ImageBuildResult
from gpuflow.runs.naming import ResourceNames

log = logging.getLogger(__name__)


class RecipeError(RuntimeError):
    pass


def default_image(config: GpuflowConfig, tag: str) -> str:
    return f"{config.region}-docker.pkg.dev/{config.project}/{config.container.repository}/{config.recipe}:{tag}"


def image_for(config: GpuflowConfig, context_dir: Path) -> str:
    """The image tagged with the build context's digest (same content, same tag)."""
    return default_image(config, context_digest(context_dir))


def render_context(config: GpuflowConfig, names: ResourceNames, work_dir: Path | None = None) -> Path:
    """Render the recipe into a build context and check it statically; return the context folder."""
    context_dir = (work_dir or Path(tempfile.mkdtemp(prefix="gpuflow-image-"))) / f"{names.prefix}-context"
    dockerfile = render_recipe(config, context_dir)
    log.info("rendered recipe %s for Beam %s / Python %s into %s", config.recipe, config.beam_version,
             config.python_version, context_dir)
    problems = check_dockerfile(dockerfile, config)
    if problems:
        raise RecipeError(f"recipe {config.recipe} fails its static checks: " + "; ".join(problems))
    log.info("static checks passed: Beam boot entrypoint, the lock installed with --require-hashes and nothing else, "
             "pinned base images, pip check, LD_LIBRARY_PATH, no driver install")
    return context_dir


def build_container(config: GpuflowConfig, names: ResourceNames, platform: ImageBackend,
                    work_dir: Path | None = None) -> dict[str, Any]:
    """Render, check and build; a remote build is only started (the result's ``job``: the task defers on it). An
    image named in container.image is used as it is: no recipe is rendered for it and nothing is built."""
    if config.container.image:
        log.info("container.image %s is set: gpuflow uses it as it is and builds nothing", config.container.image)
        return ImageBuildResult(image=config.container.image, built=False, context_dir="",
                                detail="container.image is set; nothing built").model_dump()
    context_dir = render_context(config, names, work_dir)
    image = image_for(config, context_dir)
    result = platform.build_image(context_dir, image, names)
    log.info("container image %s: %s", image, result.detail)
    return result.model_dump()
