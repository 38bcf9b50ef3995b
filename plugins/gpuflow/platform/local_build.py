"""The local profile's export and image build: the export runs here, to its end; an image is built only where a
Docker engine answers, and said plainly not built otherwise."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from gpuflow.configuration.model import DEMO_MODELS
from gpuflow.platform.base import ImageBuildResult
from gpuflow.platform.local_service import LocalService
from gpuflow.platform.processes import run_logged
from gpuflow.runs.naming import ResourceNames


class LocalExport(LocalService):
    def demo_model_dir(self, name: str = "gpuflow-demo") -> Path:
        """An offline demo model (``DEMO_MODELS``), built once per state_dir (it is deterministic)."""
        from gpuflow.platform.demo_model import write_demo_model

        directory = self.state_dir / name.replace("gpuflow-demo", "demo-model")
        if not (directory / "config.json").exists():
            staging = self.state_dir / f"{directory.name}.tmp{time.time_ns()}"
            write_demo_model(staging, architecture=DEMO_MODELS[name])
            shutil.rmtree(directory, ignore_errors=True)
            staging.rename(directory)
        return directory

    def export_model(self, model_name: str, names: ResourceNames) -> None:
        """The export runs here, to its end, in the task's own process tree (nothing to defer on)."""
        source = str(self.demo_model_dir(model_name)) if model_name in DEMO_MODELS else model_name
        run_logged(
            [sys.executable, self._script("download_model.py"), "local", "--model-name", source,
             "--state-dict-path", names.state_dict_uri, "--record-as", model_name,
             *(["--save-pretrained"] if self.config.inference.engine == "vllm" else [])],
            self.subprocess_env(),
            "export (download_model.py local)",
            timeout_s=self.config.export.timeout_s,
        )

    def cancel_export(self, job_name: str) -> None:
        """Nothing to cancel: the local export runs in the task's own process tree."""

    def find_export(self, names: ResourceNames) -> None:
        """None: no export outlives its task here."""


class LocalImages(LocalService):
    def docker_engine_answers(self) -> tuple[bool, str]:
        docker = shutil.which("docker")
        if not docker:
            return False, "no docker client on PATH"
        try:
            probe = subprocess.run([docker, "info", "--format", "{{.ServerVersion}}"], capture_output=True,
                                   text=True, timeout=20, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return False, "docker info timed out"
        if probe.returncode != 0:
            return False, (probe.stderr or probe.stdout).strip().splitlines()[-1] if (probe.stderr or probe.stdout) else "docker info failed"
        return True, f"Docker engine {probe.stdout.strip()}"

    def build_image(self, context_dir: Path, image: str, names: ResourceNames) -> ImageBuildResult:
        answers, detail = self.docker_engine_answers()
        if not answers:
            return ImageBuildResult(
                image=image, built=False, context_dir=str(context_dir),
                detail=f"NOT BUILT: no Docker engine answers here ({detail}). The recipe was rendered and checked statically.",
            )
        run_logged(["docker", "build", "-t", image, str(context_dir)], None, f"docker build {image}")
        return ImageBuildResult(image=image, built=True, context_dir=str(context_dir), detail=f"built with {detail}")

    def cancel_build(self, build_id: str) -> None:
        """Nothing to cancel: a local build (where a Docker engine answers) runs in the task's process tree."""
