"""Dataproc Serverless Spark batches with GPUs: the guide's rules, the batch request, and the memory split.

The rules follow the Dataproc Serverless "GPU acceleration" guide: executor counts and cores per
accelerator, the fixed L4 disk, the memory ceilings per configuration, premium tiers, LANG on old
runtimes, XGBoost only on runtime 1.x, and the RAPIDS shuffle manager NVIDIA recommends.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from gpuflow.catalog import version_tuple
from gpuflow.config import DataprocConfig, GpuflowConfig
from gpuflow.preflight.findings import Finding, error, warning

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


def dataproc_findings(config: GpuflowConfig) -> Iterator[Finding]:
    """Every rule of the guide; only when the configuration has a dataproc section."""
    batch = config.dataproc
    if batch is None:
        return
    if batch.executor_instances < 2:
        yield error("dataproc.executor_instances", f"GPU batches need 2 or more executors, got {batch.executor_instances}",
                    "set dataproc.executor_instances: 2 or more")
    if batch.accelerator == "l4" and batch.executor_cores not in L4_CORES:
        yield error("dataproc.executor_cores", f"L4 executors take 4, 8, 12 or 16 cores, not {batch.executor_cores}",
                    "set dataproc.executor_cores to 4 (the default), 8, 12 or 16")
    if batch.accelerator.startswith("a100") and batch.executor_cores != A100_CORES:
        yield error("dataproc.executor_cores", f"A100 executors take exactly 12 cores, not {batch.executor_cores}",
                    "set dataproc.executor_cores: 12")
    if batch.accelerator == "l4" and batch.disk_size != L4_DISK_GB:
        yield error("dataproc.disk_size", f"L4 executors have exactly 375 GB of disk, not {batch.disk_size}",
                    "set dataproc.disk_size: 375 (only A100 disks may be changed)")
    yield from _memory_findings(batch)
    if version_tuple(batch.runtime_version) < (2, 2):
        yield Finding(level="info", field="dataproc.runtime_version",
                      problem=f"runtime {batch.runtime_version} (before 2.2) needs LANG=C.UTF-8 on the driver and executors",
                      fix="gpuflow adds spark.dataproc.driverEnv.LANG and spark.executorEnv.LANG=C.UTF-8 for you")
    if batch.xgboost and version_tuple(batch.runtime_version) >= (2,):
        yield error("dataproc.xgboost", f"XGBoost ships only with runtime 1.x, not {batch.runtime_version}",
                    "set dataproc.runtime_version: '1.1', or install XGBoost with the job")
    for key in TIER_PROPERTIES:
        if batch.properties.get(key, "premium") != "premium":
            yield error(f"dataproc.properties.{key}", f"GPU batches need the premium tier, not {batch.properties[key]}",
                        f"remove {key}; gpuflow sets it to premium")
    if batch.properties.get(ACCELERATOR_PROPERTY, batch.accelerator) != batch.accelerator:
        yield error(f"dataproc.properties.{ACCELERATOR_PROPERTY}",
                    "a batch takes only one accelerator type, and dataproc.accelerator already sets it",
                    f"remove {ACCELERATOR_PROPERTY} from dataproc.properties")
    if not batch.shuffle_manager:
        yield warning("dataproc.shuffle_manager", "the RAPIDS shuffle manager is not set; NVIDIA recommends it for GPU batches",
                      "set dataproc.shuffle_manager: com.nvidia.spark.rapids.RapidsShuffleManager")


def _memory_findings(batch: DataprocConfig) -> Iterator[Finding]:
    total = max_total_memory_mb(batch)
    if batch.executor_memory is not None and batch.executor_memory_overhead is not None:
        yield error("dataproc.executor_memory", "executor_memory and executor_memory_overhead are both set",
                    "set only one of them; the other takes the rest of the maximum")
        return
    if total is None:
        return  # the cores rule already reported the impossible combination
    for field in ("executor_memory", "executor_memory_overhead"):
        value = getattr(batch, field)
        if value is not None and not MIN_MEMORY_MB <= value <= total:
            yield error(f"dataproc.{field}", f"{value} MB is outside 1024..{total} MB for {batch.accelerator}"
                        + (f" with {batch.executor_cores} cores" if batch.accelerator == "l4" else ""),
                        f"set dataproc.{field} between 1024 and {total}")
            return
    split = memory_split(batch)
    if split and split.defaulted:
        share = "40% (PySpark)" if batch.pyspark else "10%"
        yield Finding(level="info", field="dataproc.executor_memory",
                      problem=f"neither memory nor overhead is set: overhead defaults to {share} of {total} MB",
                      fix=f"executor memory {split.memory_mb} MB + overhead {split.overhead_mb} MB")


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


def build_batch(config: GpuflowConfig, main_python_file_uri: str, labels: dict[str, str] | None = None):
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
