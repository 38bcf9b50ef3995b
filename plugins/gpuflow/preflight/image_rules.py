"""Preflight rules for what the images install: each recipe's lock and the export's, read, not assumed.

The lock says torch's CUDA line (from the libraries torch's own metadata pulled), the driver that line needs
(catalog/images.yaml), and whether transformers loads models with that torch. The base image's Python is
python_version in every recipe (apache/beam_pythonX.Y_sdk, or Python X.Y installed into NVIDIA's image), so the lock
must be resolved for it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from gpuflow import catalog
from gpuflow.configuration.model import GpuflowConfig
from gpuflow.images.containers import (
    EXPORT_LOCK,
    flex_launcher_problem,
    lock_target_problems,
    recipe_lock,
    recipe_metadata,
    recipe_names,
)
from gpuflow.images.locks import LockError, lock_problems, read_lock, transformers_problems
from gpuflow.preflight.findings import Finding, error, info, warning

#: guide 000, "Install the GPU drivers": the driver's version depends on the Container-Optimized OS version Dataflow
#: uses; the job's logs name it (search for "GPU driver").
DRIVER_SOURCE = "the driver Dataflow installs depends on its Container-Optimized OS version (guide 000)"


def worker_recipe(config: GpuflowConfig) -> Iterator[Finding]:
    """The recipe exists, its lock suits the image (Python, Beam, label, transformers) and the workers' GPU."""
    if config.container.image:
        yield info("container.image", f"the workers run {config.container.image}; gpuflow builds no image and "
                   "cannot read what it installs", "the GPU check job reports the torch and CUDA the workers see")
        return
    recipe = config.recipe
    if recipe not in recipe_names():
        yield error("container.recipe", f"recipe {recipe!r} does not exist",
                    "run `gpuflow recipes` for the names")
        return
    meta = recipe_metadata(recipe)
    try:
        lock = recipe_lock(recipe)
    except LockError as problem:
        yield error("container.recipe", str(problem), "run `make lock`")
        return
    for target_problem, fix in lock_target_problems(config, lock):
        yield error("container.recipe", target_problem, fix)
    for lock_problem in lock_problems(lock, meta.cuda_major, also_cuda=meta.also_cuda):
        yield error("container.recipe", f"recipe {recipe}: {lock_problem}", "run `make lock`, then `make test`")
    if meta.min_beam and catalog.version_tuple(config.beam_version) < catalog.version_tuple(meta.min_beam):
        yield error("container.recipe", f"recipe {recipe} needs Beam >= {meta.min_beam}",
                    f"set beam_version to {meta.min_beam} or later, or use another recipe")
    yield from _recipe_for_workers(config, recipe, lock.cuda_line, lock.driver_need)
    launcher = flex_launcher_problem(config)
    if launcher:
        yield error("container.flex_launcher_tag", *launcher)


def _recipe_for_workers(config: GpuflowConfig, recipe: str, cuda: int | None, driver: int | None) -> Iterator[Finding]:
    if not config.uses_gpu:
        if cuda is not None:
            yield warning("container.recipe", f"gpu.type none runs on CPU workers, and recipe {recipe} ships torch's "
                          f"CUDA {cuda} libraries (gigabytes) for nothing",
                          "leave container.recipe empty (it picks cpu) or set container.recipe: cpu")
        return
    if cuda is None:
        yield error("container.recipe", f"recipe {recipe} installs torch's CPU build, and the workers have "
                    f"{config.gpu.type}", "leave container.recipe empty, or name a CUDA recipe (l4)")
        return
    gpu = catalog.gpu_type(config.gpu.type)
    if gpu is not None and gpu.min_cuda and cuda < gpu.min_cuda:
        yield error("container.recipe", f"{gpu.name} needs CUDA >= {gpu.min_cuda}; recipe {recipe} installs torch "
                    f"for CUDA {cuda}", f"use a CUDA {gpu.min_cuda} recipe such as l4")
    documented = gpu.min_driver if gpu is not None else None
    if gpu is not None and driver and documented and driver > documented:
        yield warning("container.recipe", f"recipe {recipe}'s torch is built for CUDA {cuda}, which needs driver >= "
                      f"{driver}; {gpu.name}'s page asks only for >= {documented}, and {DRIVER_SOURCE}",
                      "run the GPU check job first, and read the job's 'GPU driver' log line; a CUDA 12 recipe "
                      "(l4) needs only >= 525")
    elif driver and config.traits.dataflow_workers:
        yield info("container.recipe", f"recipe {recipe}'s torch is built for CUDA {cuda}: it needs driver >= "
                   f"{driver}; {DRIVER_SOURCE}", "the GPU check job confirms that torch sees the GPU")


def export_lock(config: GpuflowConfig) -> Iterator[Finding]:
    """The export installs its lock on the prebuilt image's own torch and Python (gcp profile only)."""
    image = config.export.container_image
    versions = catalog.export_image_versions(image)
    if versions is None:
        yield error("export.container_image", f"{image} is not one of Vertex AI's prebuilt PyTorch images, so "
                    "gpuflow cannot tell its torch", "use a pytorch-cpu.X-Y.pyXY image from "
                    "cloud.google.com/vertex-ai/docs/training/pre-built-containers")
        return
    torch, python = versions
    try:
        lock = read_lock(EXPORT_LOCK)
    except LockError as problem:
        yield error("export.container_image", str(problem), "run `make lock`")
        return
    if python is None:  # gpuflow's check, not Google's rule: a warning
        yield warning("export.container_image", f"{image}'s name gives no Python (an older prebuilt image), so "
                      f"gpuflow cannot check that docker/locks/export.lock (Python {lock.python}) installs there",
                      "use a pytorch-cpu.X-Y.pyXY image from cloud.google.com/vertex-ai/docs/training/"
                      "pre-built-containers, whose name says its Python")
    elif lock.python != python:
        yield error("export.container_image", f"{image} runs Python {python}, and docker/locks/export.lock is "
                    f"resolved for Python {lock.python}", "run `make lock` (it reads the export image's Python)")
    for torch_problem in transformers_problems(lock, image_torch=torch):
        yield error("export.container_image", torch_problem, "pin a transformers in docker/locks/export.in that accepts "
                    "the image's torch, then `make lock`; or use a newer prebuilt PyTorch image")
    unpinned = [package for package in config.export.pip_packages if not re.search(r"==[^*]+$", package)]
    if unpinned:
        yield warning("export.pip_packages", f"{unpinned} are not pinned: what the export installs then changes "
                      "with the day it runs", "pin each as name==version")


IMAGE_RULES = [worker_recipe, export_lock]
