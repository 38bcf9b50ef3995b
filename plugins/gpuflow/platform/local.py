"""The local profile: emulators, Beam's DirectRunner in subprocesses, no cloud account. One Platform made of a part
per kind of work, like the gcp profile's:

- export and image: local_build.LocalExport, local_build.LocalImages;
- jobs (the GPU check, the pipeline): local_jobs.LocalProcesses;
- here: this machine's GPUs (nvidia-smi).
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

from gpuflow.platform.base import JobHandle
from gpuflow.platform.local_build import LocalExport, LocalImages
from gpuflow.platform.local_jobs import LocalProcesses


class LocalPlatform(LocalExport, LocalImages, LocalProcesses):
    #: No Compute Engine here: preflight's region check reads the catalog's table.
    zones_offering = None

    def access_probe(self, impersonation_chain: list[str] | None = None) -> None:
        """No project, no APIs or IAM: the emulators take every call."""
        return None

    def gpu_usage(self, handle: JobHandle | None, started: float, ended: float) -> dict[str, Any]:
        """nvidia-smi's readings now, where a GPU exists; otherwise says plainly that there is none. (On gcp the
        smoke test reads Cloud Monitoring in its trigger, gpuflow.triggers.monitoring.)"""
        nvidia_smi = shutil.which("nvidia-smi")
        if not nvidia_smi:
            return {"source": "nvidia-smi", "gpus": [], "note": "no GPU on this machine: inference ran on the CPU"}
        query = subprocess.run([nvidia_smi, "--query-gpu=name,utilization.gpu,utilization.memory",
                                "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30,
                               stdin=subprocess.DEVNULL)
        gpus: list[dict[str, Any]] = []
        for line in query.stdout.strip().splitlines():
            name, utilization, memory = (part.strip() for part in line.split(","))
            gpus.append({"name": name, "utilization": float(utilization) / 100,
                         "memory_utilization": float(memory) / 100})
        return {"source": "nvidia-smi", "gpus": gpus,
                "max_utilization": max((float(g["utilization"]) for g in gpus), default=0.0)}

    def gpu_capacity(self) -> dict[str, Any]:
        nvidia_smi = shutil.which("nvidia-smi")
        if nvidia_smi:
            listing = subprocess.run([nvidia_smi, "-L"], capture_output=True, text=True, timeout=30,
                                     stdin=subprocess.DEVNULL)
            gpus = [line for line in listing.stdout.splitlines() if line.startswith("GPU ")]
            return {"source": "nvidia-smi", "gpus": gpus, "count": len(gpus)}
        return {"source": "nvidia-smi", "gpus": [], "count": 0, "note": "nvidia-smi not found: no GPU on this machine"}

