"""The locks of what gpuflow's images install: resolved for the image's own platform and Python, read back, checked.

Each lock in ``docker/locks/`` is written by ``make lock`` (``uv pip compile --generate-hashes``) from the ``.in``
beside it, for Linux x86_64 (manylinux_2_28) and the image's Python, not for this machine. The recipes install it
with ``pip install --require-hashes``. What a lock says (torch's CUDA line and the libraries it pulls, the driver that
line needs, whether transformers accepts that torch) is read from the lock itself, never from a label.
"""

from __future__ import annotations

import os
import re
import shutil
import string
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from gpuflow import catalog
from gpuflow.paths import project_path

LOCKS_DIR = project_path("docker") / "locks"
#: The platform every image runs on: Dataflow's workers and Vertex AI's machines are Linux x86_64. manylinux_2_28
#: is the oldest glibc the pinned wheels (torch among them) are built for; every base image here has a newer one.
PLATFORM = "x86_64-manylinux_2_28"
#: torch's CPU builds (``+cpu``) are published only on PyTorch's own index, not on PyPI.
PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
_HEADER = "# gpuflow-lock:"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s\\;]+)")
_CUDA_SUFFIX = re.compile(r"^nvidia-.*-cu(\d+)$")


class LockError(RuntimeError):
    """A lock that cannot be written or resolved; the message names the fix."""


@dataclass(frozen=True)
class Lock:
    """One lock file read back: its target and the exact version of every package it installs."""

    name: str
    python: str
    beam: str | None
    packages: dict[str, str]
    unhashed: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def torch(self) -> str | None:
        return self.packages.get("torch")

    @property
    def cuda_line(self) -> int | None:
        """torch's CUDA major: the line of the CUDA runtime it pulled; None for a CPU build or no torch."""
        runtime = next((version for name, version in self.packages.items()
                        if name in ("nvidia-cuda-runtime", "nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime-cu11")),
                       None)
        return int(runtime.split(".")[0]) if runtime else None

    @property
    def cuda_lines_pulled(self) -> set[int]:
        """Every CUDA line a library in the lock is built for (its ``-cuNN`` suffix), torch's runtime included."""
        lines = {int(found[1]) for name in self.packages if (found := _CUDA_SUFFIX.match(name))}
        return lines | ({self.cuda_line} if self.cuda_line else set())

    @property
    def driver_need(self) -> int | None:
        return catalog.driver_for_cuda(self.cuda_line) if self.cuda_line else None


def input_path(name: str) -> Path:
    return LOCKS_DIR / f"{name}.in"


def lock_path(name: str) -> Path:
    return LOCKS_DIR / f"{name}.lock"


def lock_names() -> list[str]:
    return sorted(path.stem for path in LOCKS_DIR.glob("*.in"))


def parse_lock(name: str, text: str) -> Lock:
    header = next((line for line in text.splitlines() if line.startswith(_HEADER)), None)
    if header is None:
        raise LockError(f"{lock_path(name)} has no '{_HEADER}' line. Fix: run `make lock`.")
    target = dict(item.split("=", 1) for item in header.removeprefix(_HEADER).split())
    packages, unhashed = {}, []
    # A requirement runs over continuation lines (`\`) that carry its hashes.
    for entry in re.split(r"\n(?=[A-Za-z0-9])", text):
        found = _PIN.match(entry)
        if found:
            packages[canonical(found[1])] = found[2]
            if "--hash=sha256:" not in entry:
                unhashed.append(found[1])
    notes = tuple(line.removeprefix("# note:").strip() for line in text.splitlines() if line.startswith("# note:"))
    return Lock(name, target["python"], target.get("beam"), packages, tuple(unhashed), notes)


def read_lock(name: str) -> Lock:
    path = lock_path(name)
    if not path.exists():
        raise LockError(f"{path} does not exist. Fix: run `make lock`.")
    return parse_lock(name, path.read_text())


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def input_pins(name: str, beam_version: str) -> dict[str, str]:
    """The exact pins the ``.in`` file asks for, with the Beam version filled in."""
    text = string.Template(input_path(name).read_text()).substitute(beam_version=beam_version)
    return {canonical(found[1]): found[2] for line in text.splitlines() if (found := _PIN.match(line.strip()))}


def lock_problems(lock: Lock, cuda_label: int | None, image_torch: str | None = None,
                  also_cuda: tuple[int, ...] = ()) -> list[str]:
    """What is wrong with a lock for the image it is for: a CUDA line unlike the recipe's label, a library built for
    another line (unless the recipe's label names it in ``also_cuda``), a transformers that turns PyTorch off with
    this torch, an unhashed or stale pin."""
    problems = []
    pulled = lock.cuda_lines_pulled - set(also_cuda)
    if cuda_label is None and pulled:
        problems.append(f"lock {lock.name} installs CUDA {sorted(pulled)} libraries, yet its recipe is labelled CPU")
    if cuda_label is not None and lock.cuda_line != cuda_label:
        problems.append(f"lock {lock.name}: torch {lock.torch} is built for CUDA {lock.cuda_line}, yet its recipe is "
                        f"labelled CUDA {cuda_label}")
    if cuda_label is not None and pulled - {cuda_label}:
        problems.append(f"lock {lock.name} pulls libraries built for CUDA {sorted(pulled - {cuda_label})}, yet its "
                        f"recipe is labelled CUDA {cuda_label}")
    problems += transformers_problems(lock, image_torch)
    if lock.unhashed:
        problems.append(f"lock {lock.name} pins without a hash: {', '.join(lock.unhashed)}. Fix: run `make lock`.")
    if input_path(lock.name).exists():
        stale = {pkg: version for pkg, version in input_pins(lock.name, lock.beam or "").items()
                 if lock.packages.get(pkg) != version}
        if stale:
            problems.append(f"lock {lock.name} is older than {input_path(lock.name).name} ({stale}). Fix: run "
                            "`make lock`.")
    return problems


def transformers_problems(lock: Lock, image_torch: str | None = None) -> list[str]:
    """transformers disables PyTorch below its floor, silently for pip check; the torch is the lock's or the image's."""
    transformers, torch = lock.packages.get("transformers"), lock.torch or image_torch
    if not transformers or not torch:
        return []
    floor = catalog.transformers_torch_floor(transformers)
    if floor is None:
        return [f"lock {lock.name}: the torch floor of transformers {transformers} is not in catalog/images.yaml. "
                "Fix: read it in its transformers/utils/import_utils.py and add it."]
    if catalog.version_tuple(torch.split("+")[0]) < catalog.version_tuple(floor):
        return [f"lock {lock.name}: transformers {transformers} turns PyTorch off below torch {floor}, and the "
                f"image has torch {torch}"]
    return []


# --------------------------------------------------------------------------------------------
# Writing and resolving, with uv (requirements-dev.txt); both reach only the package registry.


def _uv() -> str:
    found = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    if not Path(found).exists():
        raise LockError("uv is not installed. Fix: `make venv` (requirements-dev.txt pins it).")
    return found


def _local_wheels(lock_text: str) -> list[str]:
    """PyTorch's CPU index is not reachable from gpuflow's build machines; a local copy of its wheel (pip's own
    PIP_FIND_LINKS) stands in for it, and the lock says so."""
    links = os.environ.get("PIP_FIND_LINKS")
    return ["--find-links", links] if links and "+cpu" in lock_text else []


def compile_lock(name: str, python: str, beam_version: str | None) -> Path:
    """Resolve ``name.in`` for the image's platform and Python into ``name.lock``, with hashes."""
    source = input_path(name).read_text()
    with tempfile.TemporaryDirectory() as folder:
        filled = Path(folder) / f"{name}.in"
        filled.write_text(string.Template(source).substitute(beam_version=beam_version or ""))
        command = [_uv(), "pip", "compile", str(filled), "--python-platform", PLATFORM, "--python-version", python,
                   "--generate-hashes", "--no-header", "--quiet", *_local_wheels(source)]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        resolved = result.stdout.replace(str(filled), f"docker/locks/{name}.in")
    if result.returncode != 0:
        raise LockError(f"uv could not resolve {input_path(name)} for Python {python}:\n{result.stderr.strip()}")
    target = f"python={python}" + (f" beam={beam_version}" if "${beam_version}" in source else "")
    lines = [f"{_HEADER} {target} platform={PLATFORM}",
             f"# Written by `make lock` from {name}.in (uv pip compile --generate-hashes). Do not edit."]
    if _local_wheels(source):
        lines.append(f"# note: the +cpu torch hash was read from a local copy of its wheel (PIP_FIND_LINKS), not from "
                     f"{PYTORCH_CPU_INDEX}, which the machine that wrote this lock could not reach; the image build "
                     "(pip --require-hashes) fails if they differ.")
    path = lock_path(name)
    path.write_text("\n".join(lines) + "\n" + resolved)
    return path


@dataclass(frozen=True)
class Resolution:
    lock: str
    python: str
    would_install: list[str]


def resolve_lock(name: str) -> Resolution:
    """Install the lock as pip would inside the image, dry-run, for its platform and Python: every pin must exist for
    that target, and the lock must hold every dependency (hash-checking mode refuses one that is missing)."""
    lock = read_lock(name)
    text = lock_path(name).read_text()
    with tempfile.TemporaryDirectory() as target:
        command = [_uv(), "pip", "install", "--dry-run", "--require-hashes", "--python-platform", PLATFORM,
                   "--python-version", lock.python, "--target", target, "-r", str(lock_path(name)),
                   *_local_wheels(text)]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise LockError(f"lock {name} does not resolve for Python {lock.python} on {PLATFORM}:\n"
                        f"{result.stderr.strip()}")
    installs = [line.strip()[2:] for line in result.stderr.splitlines() + result.stdout.splitlines()
                if line.strip().startswith("+ ")]
    return Resolution(name, lock.python, installs)
