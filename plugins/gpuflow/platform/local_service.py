"""What every part of the local profile shares: the configuration, its state folder, the emulators' environment."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from gpuflow.configuration.loading import beam_jobs_dir
from gpuflow.configuration.model import GpuflowConfig
from gpuflow.platform.emulators import LOCAL_CONN_ID, emulator_env, emulator_environment


class LocalService:
    conn_id = LOCAL_CONN_ID

    def __init__(self, config: GpuflowConfig):
        self.config = config
        self.state_dir = Path(config.local.state_dir)

    def environment(self) -> contextlib.AbstractContextManager[Any]:
        return emulator_environment(self.config)

    def subprocess_env(self) -> dict[str, str]:
        return {**os.environ, **emulator_env(self.config), "PYTHONUNBUFFERED": "1"}

    def _script(self, name: str) -> str:
        return str(beam_jobs_dir() / name)
