"""build_container: render the recipe for the configured versions, check it, build it where possible."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

from gpuflow.config import GpuflowConfig
from gpuflow.containers import check_dockerfile, context_digest, render_recipe
from gpuflow.naming import ResourceNames
from gpuflow.platform import Platform

log = logging.getLogger(__name__)


class RecipeError(RuntimeError):
    pass


def default_image(config: GpuflowConfig, tag: str) -> str:
    return f"{config.region}-docker.pkg.dev/{config.project}/gpuflow/{config.container.recipe}:{tag}"


def build_container(config: GpuflowConfig, names: ResourceNames, platform: Platform,
                    work_dir: Path | None = None) -> dict[str, Any]:
    context_dir = (work_dir or Path(tempfile.mkdtemp(prefix="gpuflow-image-"))) / f"{names.prefix}-context"
    dockerfile = render_recipe(config, context_dir)
    log.info("rendered recipe %s for Beam %s / Python %s into %s", config.container.recipe, config.beam_version,
             config.python_version, context_dir)
    problems = check_dockerfile(dockerfile, config)
    if problems:
        raise RecipeError(f"recipe {config.container.recipe} fails its static checks: " + "; ".join(problems))
    log.info("static checks passed: Beam boot entrypoint, pip check, LD_LIBRARY_PATH, no driver install")
    image = config.container.image or default_image(config, context_digest(context_dir))
    result = platform.build_image(context_dir, image)
    log.info("container image %s: %s", image, result.detail)
    return result.model_dump()
