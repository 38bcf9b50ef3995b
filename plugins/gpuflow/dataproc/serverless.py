"""Dataproc Serverless Spark batches with GPUs: the guide's limits, the batch request, and the memory split.

The limits follow the Dataproc Serverless "GPU acceleration" guide (guide 004): executor counts and cores per
accelerator, the fixed L4 disk, the memory ceilings per configuration, premium tiers, LANG on old runtimes. Preflight
checks a configuration against them in ``gpuflow.preflight.dataproc_rules``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuflow.catalog import version_tuple
from gpuflow.configuration.model import DataprocConfig, GpuflowConfig

if TYPE_CHECKING:
    from google.cloud import dataproc_v1

#: The guide's maximum executor memory + overhead, in MB, per accelerator (and, for L4, cores).
MAX_TOTAL_MEMORY_MB = {
    ("a100-40", None): 78040,
    ("a100-80", None): 165080,
    ("l4", 4): 13384,
    ("l4", 8): 26768,
    ("l4", 12): 40152,
    ("l4", 16): 53536,
}
L4_CORES = (4, 8, 12, 16)
A100_CORES = 12
L4_DISK_GB = 375
MIN_MEMORY_MB = 1024
ACCELERATOR_PROPERTY = "spark.dataproc.executor.resource.accelerator.type"
TIER_PROPERTIES = ("spark.dataproc.executor.compute.tier", "spark.dataproc.executor.disk.tier")
LANG_PROPERTIES = ("spark.dataproc.driverEnv.LANG", "spark.executorEnv.LANG")
SHIELDED_VM_CONSTRAINT = "constraints/compute.requireShieldedVm"


def max_total_memory_mb(batch: DataprocConfig) -> int | None:
    key = (batch.accelerator, batch.executor_cores if batch.accelerator == "l4" else None)
    return MAX_TOTAL_MEMORY_MB.get(key)


@dataclass(frozen=True)
class MemorySplit:
    memory_mb: int
    overhead_mb: int
    defaulted: bool


def memory_split(batch: DataprocConfig) -> MemorySplit | None:
    """The executor memory and overhead Dataproc will use: the unset one takes the rest of the maximum."""
    total = max_total_memory_mb(batch)
    if total is None:
        return None
    if batch.executor_memory is not None:
        return MemorySplit(batch.executor_memory, total - batch.executor_memory, False)
    if batch.executor_memory_overhead is not None:
        return MemorySplit(total - batch.executor_memory_overhead, batch.executor_memory_overhead, False)
    overhead = int(total * (0.4 if batch.pyspark else 0.1))
    return MemorySplit(total - overhead, overhead, True)


def batch_properties(batch: DataprocConfig) -> dict[str, str]:
    """The Spark properties of the batch: gpuflow's GPU settings, then the user's other properties."""
    split = memory_split(batch)
    properties = {
        ACCELERATOR_PROPERTY: batch.accelerator,
        **dict.fromkeys(TIER_PROPERTIES, "premium"),
        "spark.dataproc.executor.disk.size": f"{batch.disk_size}g",
        "spark.executor.instances": str(batch.executor_instances),
        "spark.executor.cores": str(batch.executor_cores),
    }
    if split:
        properties["spark.executor.memory"] = f"{split.memory_mb}m"
        properties["spark.executor.memoryOverhead"] = f"{split.overhead_mb}m"
    if version_tuple(batch.runtime_version) < (2, 2):
        properties.update(dict.fromkeys(LANG_PROPERTIES, "C.UTF-8"))
    if batch.shuffle_manager:
        properties["spark.shuffle.manager"] = batch.shuffle_manager
    return {**batch.properties, **properties}


def build_batch(config: GpuflowConfig, main_python_file_uri: str,
                labels: dict[str, str] | None = None) -> dataproc_v1.Batch:
    """The ``google.cloud.dataproc_v1.Batch`` the gcp profile submits."""
    from google.cloud import dataproc_v1

    batch = config.dataproc
    if batch is None:
        raise ValueError("the configuration has no dataproc section. Fix: add one (see configs/dataproc.example.yaml).")
    return dataproc_v1.Batch(
        pyspark_batch=dataproc_v1.PySparkBatch(main_python_file_uri=main_python_file_uri, args=list(batch.args)),
        runtime_config=dataproc_v1.RuntimeConfig(version=batch.runtime_version, properties=batch_properties(batch)),
        labels=labels or {},
    )


def batch_id_for(prefix: str) -> str:
    """Dataproc batch ids: 4-63 lowercase letters, digits and hyphens; stable for a run."""
    return f"{prefix}-gpu-batch"[:63]
