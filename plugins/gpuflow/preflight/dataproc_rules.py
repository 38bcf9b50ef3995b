"""Preflight's Dataproc Serverless rules: seed 004's limits (guide 004), each with its fix, before a batch is created.

The numbers (cores, disk, memory per accelerator) live with the batch they shape, in ``gpuflow.dataproc.serverless``.
"""

from __future__ import annotations

from collections.abc import Iterator

from gpuflow.catalog import version_tuple
from gpuflow.configuration.model import DataprocConfig, GpuflowConfig
from gpuflow.dataproc.serverless import (
    A100_CORES,
    ACCELERATOR_PROPERTY,
    L4_CORES,
    L4_DISK_GB,
    MIN_MEMORY_MB,
    TIER_PROPERTIES,
    max_total_memory_mb,
    memory_split,
)
from gpuflow.preflight.findings import Finding, error, warning


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
