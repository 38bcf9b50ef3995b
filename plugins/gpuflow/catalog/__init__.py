"""The GPU, machine-type, region and model tables, loaded from the YAML files beside this module."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

CATALOG_DIR = Path(__file__).resolve().parent


def version_tuple(version: str) -> tuple[int, ...]:
    """'2.50.0' -> (2, 50, 0), for comparing Beam releases and Dataproc runtimes."""
    return tuple(int(part) for part in version.split(".") if part.isdigit())


@functools.cache
def _load(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((CATALOG_DIR / f"{name}.yaml").read_text())
    return loaded


@dataclass(frozen=True)
class GpuType:
    name: str
    memory_gb: float
    bf16: bool
    families: tuple[str, ...]
    counts: tuple[int, ...]
    quota_metric: str | None  # None: no regional Compute Engine metric (then quota_families name the Cloud Quotas one)
    # The Cloud Quotas gpu_family of GPUS-PER-GPU-FAMILY-per-project-region, each spelling Google's pages use.
    quota_families: tuple[str, ...] = ()
    min_beam: str | None = None
    recommended_beam: str | None = None
    min_driver: int | None = None
    min_cuda: int | None = None


@dataclass(frozen=True)
class MachineSpec:
    name: str
    family: str
    vcpus: int
    memory_gb: float
    fixed_gpu: str | None = None
    fixed_gpu_count: int | None = None


def gpu_types() -> dict[str, GpuType]:
    table = _load("gpus")["gpu_types"]["types"]
    return {
        name: GpuType(
            name=name,
            memory_gb=row["memory_gb"],
            bf16=row["bf16"],
            families=tuple(row["families"]),
            counts=tuple(row.get("counts", ())),
            quota_metric=row["quota_metric"],
            quota_families=tuple(row.get("quota_families", ())),
            min_beam=row.get("min_beam"),
            recommended_beam=row.get("recommended_beam"),
            min_driver=row.get("min_driver"),
            min_cuda=row.get("min_cuda"),
        )
        for name, row in table.items()
    }


def gpu_type(name: str) -> GpuType | None:
    return gpu_types().get(name)


_N1_PRESET = re.compile(r"n1-(standard|highmem|highcpu)-(\d+)$")
_CUSTOM = re.compile(r"(n1-)?custom-(\d+)-(\d+)(-ext)?$")


def machine_spec(name: str) -> MachineSpec | None:
    """The catalog's fixed-GPU machine types, N1 presets and N1 custom types (with extended memory)."""
    machines = _load("gpus")["machine_types"]
    fixed = machines["fixed"].get(name)
    if fixed:
        gpu, count, vcpus, memory = fixed
        return MachineSpec(name, name.split("-", 1)[0], vcpus, memory, gpu, count)
    if match := _N1_PRESET.match(name):
        series, vcpus = match.group(1), int(match.group(2))
        return MachineSpec(name, "n1", vcpus, vcpus * machines["n1_memory_gb_per_vcpu"][series])
    if match := _CUSTOM.match(name):
        return MachineSpec(name, "n1", int(match.group(2)), int(match.group(3)) / 1024)
    return None


def n1_caps(gpu: str, count: int) -> tuple[int, float] | None:
    """The most vCPUs and GB of memory an N1 machine may have with ``count`` GPUs of type ``gpu``; None where the
    catalog holds no figure (gpus.yaml, n1_caps)."""
    caps = _load("gpus")["machine_types"]["n1_caps"]["limits"].get(gpu, {}).get(count)
    return (caps[0], caps[1]) if caps else None


def regions_offering(gpu: str) -> list[str]:
    """The regions the offline table lists ``gpu`` in (none: the table does not know the GPU)."""
    return [region for region, offered in _load("gpus")["regions"]["offers"].items() if gpu in offered]


def fixed_gpu_machine_types(gpu: str) -> list[str]:
    return [name for name, row in _load("gpus")["machine_types"]["fixed"].items() if row[0] == gpu]


def region_offers(region: str) -> list[str] | None:
    """GPU types the region offers, or None when the table does not know the region."""
    offers: list[str] | None = _load("gpus")["regions"]["offers"].get(region)
    return offers


def table_date(table: str) -> str:
    data = _load("gpus")
    return str(data[table]["as_of"] if table in data else _load("models")["as_of"])


@dataclass(frozen=True)
class ModelSize:
    parameters_m: float
    export_machine: str
    export_disk_gb: int
    cpu_worker_machine: str | None = None  # guide 002's machine for the pipeline on CPU workers (gpu.type none)
    architecture: str = "seq2seq"
    # A decoder-only model's KV-cache shape, where a source gives it: layers, key/value heads, head dimension.
    layers: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None


def model_size(name: str) -> ModelSize | None:
    row = _load("models")["models"].get(name)
    return ModelSize(**row) if row else None


def export_size_for(parameters_m: float, architecture: str = "seq2seq") -> ModelSize:
    """The export machine of the smallest catalog model of the architecture at least this large (the largest
    one's beyond)."""
    rows = [ModelSize(**row) for row in _load("models")["models"].values()]
    sizes = sorted((size for size in rows if size.architecture == architecture), key=lambda s: s.parameters_m)
    return next((size for size in sizes if size.parameters_m >= parameters_m), sizes[-1])


def cpu_worker_machine_for(name: str, parameters_m: float | None) -> str:
    """Guide 002's n2-highmem machine for a model on CPU workers: the model's own row, else the row of the smallest
    model with a row that is at least as large (the largest row's beyond), else n2-highmem-4 (flan-t5-large's)."""
    size = model_size(name)
    if size is not None and size.cpu_worker_machine:
        return size.cpu_worker_machine
    rows = sorted((ModelSize(**row) for row in _load("models")["models"].values() if row.get("cpu_worker_machine")),
                  key=lambda row: row.parameters_m)
    if parameters_m is None:
        return "n2-highmem-4"
    return next((row for row in rows if row.parameters_m >= parameters_m), rows[-1]).cpu_worker_machine or "n2-highmem-4"


def bytes_per_parameter(dtype: str) -> int:
    return int(_load("models")["bytes_per_parameter"][dtype])


def runtime_overhead() -> float:
    return float(_load("models")["runtime_overhead"])


def driver_for_cuda(cuda_major: int) -> int | None:
    """The oldest driver branch that runs CUDA ``cuda_major`` builds (NVIDIA's minor version compatibility)."""
    driver: int | None = _load("images")["cuda_drivers"]["min_driver"].get(cuda_major)
    return driver


def transformers_torch_floor(transformers_version: str) -> str | None:
    """The oldest torch a transformers release loads models with; None where gpuflow has not read it."""
    floor: str | None = _load("images")["transformers_torch_floor"]["releases"].get(transformers_version)
    return floor


def flex_launcher_tag(python_version: str) -> str | None:
    """The pinned tag of the Flex Template launcher image for ``python_version`` (images.yaml's flex_launcher)."""
    tag: str | None = _load("images")["flex_launcher"]["tags"].get(python_version)
    return tag


def export_image_versions(image_uri: str) -> tuple[str, str | None] | None:
    """(torch, python) of a Vertex AI prebuilt PyTorch image, read from its name (python None where the name has no
    .pyXY, as older images); None for another image."""
    found = re.search(_load("images")["export_images"]["name_pattern"], image_uri)
    if not found:
        return None
    python = f"{found['py_major']}.{found['py_minor']}" if found["py_major"] else None
    return f"{found['torch_major']}.{found['torch_minor']}", python


@dataclass(frozen=True)
class AccessNeed:
    """What one kind of step needs of a project: its APIs, and each permission with the role that grants it."""

    name: str
    what: str
    apis: tuple[str, ...]
    permissions: dict[str, str]  # permission -> predefined role
    source: str


def access_needs() -> dict[str, AccessNeed]:
    return {name: AccessNeed(name=name, what=row["what"], apis=tuple(row["apis"]), permissions=dict(row["permissions"]),
                             source=" ".join(row["source"].split()))
            for name, row in _load("access")["needs"].items()}


def access_table(section: str) -> dict[str, Any]:
    """One of access.yaml's other sections: worker_service_account, build_service_account, check_reads,
    org_policies."""
    return dict(_load("access")[section])


def composer_floor() -> dict[str, Any]:
    """The oldest Composer image line and packages gpuflow runs on (composer.yaml's floor, with its source)."""
    return dict(_load("composer")["floor"])


def composer_tested_lines() -> dict[str, dict[str, Any]]:
    """The Composer lines `make test-composer LINE=…` runs gpuflow on: their pinned packages and constraints."""
    return dict(_load("composer")["tested_lines"])


@dataclass(frozen=True)
class MachinePrice:
    """A machine type's on-demand list price in a region (USD per hour, its GPUs included where the type fixes them),
    and where it was read."""

    usd_per_hour: float
    source: str
    read: str


def machine_price(region: str, machine_type: str) -> MachinePrice | None:
    """The catalog's price of ``machine_type`` in ``region`` (prices.yaml); None when no figure was read."""
    table = _load("prices")["machines"]
    figure = (table["regions"].get(region) or {}).get(machine_type)
    return None if figure is None else MachinePrice(float(figure), " ".join(table["source"].split()), table["read"])

