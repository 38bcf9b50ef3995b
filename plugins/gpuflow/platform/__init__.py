"""Profile-specific platforms, picked once from ``config.profile``."""

from __future__ import annotations

from gpuflow.configuration.model import GpuflowConfig
from gpuflow.platform.base import (
    ExportBackend,
    GpuBackend,
    ImageBackend,
    ImageBuildResult,
    JobBackend,
    JobFinder,
    JobHandle,
    Platform,
)

__all__ = ["ExportBackend", "GpuBackend", "ImageBackend", "ImageBuildResult", "JobBackend", "JobFinder", "JobHandle",
           "Platform", "get_platform"]


def get_platform(config: GpuflowConfig) -> Platform:
    if config.profile == "local":
        from gpuflow.platform.local import LocalPlatform

        return LocalPlatform(config)
    from gpuflow.platform.gcp import GcpPlatform

    return GcpPlatform(config)
