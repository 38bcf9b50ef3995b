"""Profile-specific platforms, picked once from ``config.profile``."""

from __future__ import annotations

from gpuflow.config import GpuflowConfig
from gpuflow.platform.base import ImageBuildResult, JobHandle, Platform

__all__ = ["ImageBuildResult", "JobHandle", "Platform", "GcpProfileNotAvailable", "get_platform"]


class GcpProfileNotAvailable(NotImplementedError):
    """The gcp profile's tasks are not built yet; preflight reports this before anything is created."""


def get_platform(config: GpuflowConfig) -> Platform:
    if config.profile == "local":
        from gpuflow.platform.local import LocalPlatform

        return LocalPlatform(config)
    raise GcpProfileNotAvailable(
        "The gcp profile's tasks (Vertex AI export, Cloud Build, Dataflow launch) are not implemented in this "
        "version of gpuflow. Fix: set profile: local."
    )
