"""The Dataproc Serverless GPU guide's rules, the memory split, and the batch request gpuflow submits."""

import pytest
from google.cloud import dataproc_v1

from gpuflow.configuration.loading import load_config
from gpuflow.dataproc.serverless import build_batch, memory_split
from gpuflow.gpus.troubleshoot import classify
from gpuflow.preflight import run_preflight

EXAMPLE = "configs/dataproc.example.yaml"


def findings(*overrides, workflow="dataproc"):
    return run_preflight(load_config(EXAMPLE, overrides=list(overrides)), check_environment=False, workflow=workflow)


def test_the_example_is_a_valid_l4_batch():
    assert [f for f in findings() if f.level in ("error", "warning")] == []


def test_the_batchs_preflight_says_nothing_of_dataflow():
    """No Dataflow worker runs: the SDK processes' model copies, the container's CUDA line and require_gpu are
    Dataflow's, and the Dataproc batch's preflight leaves them out (the inference workflow's does not)."""
    dataflow_fields = ("gpu.", "container.", "require_gpu", "model.", "inference.", "dataflow")
    on_gcp = ("profile=gcp", "project=acme-ml-prod")
    assert [f for f in findings(*on_gcp) if f.field.startswith(dataflow_fields)] == []
    assert [f for f in findings(*on_gcp, workflow="inference") if f.field.startswith(dataflow_fields)] != []
    assert {f.field for f in findings(*on_gcp, "dataproc.executor_instances=1") if f.level != "info"} == {
        "dataproc.executor_instances"}


CASES = [
    (["dataproc.executor_instances=1"], "dataproc.executor_instances", "error", "2 or more"),
    (["dataproc.executor_cores=6"], "dataproc.executor_cores", "error", "4 (the default), 8, 12 or 16"),
    (["dataproc.accelerator=a100-40", "dataproc.executor_cores=8"], "dataproc.executor_cores", "error",
     "dataproc.executor_cores: 12"),
    (["dataproc.disk_size=500"], "dataproc.disk_size", "error", "375"),
    (["dataproc.executor_memory=4096"], "dataproc.executor_memory", "error", "only one of them"),
    (["dataproc.executor_memory_overhead=13385"], "dataproc.executor_memory_overhead", "error", "between 1024 and 13384"),
    (["dataproc.executor_memory_overhead=1000"], "dataproc.executor_memory_overhead", "error", "between 1024 and 13384"),
    (["dataproc.executor_memory_overhead=null", "dataproc.executor_cores=16", "dataproc.executor_memory=60000"],
     "dataproc.executor_memory", "error", "between 1024 and 53536"),
    (["dataproc.runtime_version=2.1"], "dataproc.runtime_version", "info", "LANG=C.UTF-8"),
    (["dataproc.xgboost=true"], "dataproc.xgboost", "error", "1.1"),
    (["dataproc.properties={spark.dataproc.executor.disk.tier: standard}"],
     "dataproc.properties.spark.dataproc.executor.disk.tier", "error", "premium"),
    (["dataproc.properties={spark.dataproc.executor.resource.accelerator.type: a100-40}"],
     "dataproc.properties.spark.dataproc.executor.resource.accelerator.type", "error", "remove"),
    (["dataproc.shuffle_manager=null"], "dataproc.shuffle_manager", "warning", "RapidsShuffleManager"),
]


@pytest.mark.parametrize(("overrides", "field", "level", "fix_words"), CASES)
def test_each_rule_names_the_field_and_the_fix(overrides, field, level, fix_words):
    matching = [f for f in findings(*overrides) if f.field == field and f.level == level and fix_words in f.fix]
    assert matching, findings(*overrides)


@pytest.mark.parametrize(
    ("accelerator", "cores", "total"),
    [("a100-40", 12, 78040), ("a100-80", 12, 165080), ("l4", 4, 13384), ("l4", 8, 26768), ("l4", 12, 40152),
     ("l4", 16, 53536)],
)
def test_memory_split_takes_the_guides_maximum(accelerator, cores, total):
    config = load_config(EXAMPLE, overrides=[f"dataproc.accelerator={accelerator}", f"dataproc.executor_cores={cores}",
                                             "dataproc.executor_memory_overhead=2048"])
    split = memory_split(config.dataproc)
    assert (split.memory_mb, split.overhead_mb) == (total - 2048, 2048)


def test_default_split_is_40_percent_for_pyspark_and_10_otherwise():
    pyspark = load_config(EXAMPLE, overrides=["dataproc.executor_memory_overhead=null"]).dataproc
    assert memory_split(pyspark).overhead_mb == int(13384 * 0.4)
    other = load_config(EXAMPLE, overrides=["dataproc.executor_memory_overhead=null", "dataproc.pyspark=false"]).dataproc
    assert memory_split(other).overhead_mb == int(13384 * 0.1)
    assert any("overhead defaults to 40%" in f.problem for f in findings("dataproc.executor_memory_overhead=null"))


def test_l4_batch_request_carries_the_guides_properties():
    config = load_config(EXAMPLE, overrides=["dataproc.runtime_version=2.1"])
    batch = build_batch(config, "gs://b/main.py", labels={"gpuflow-run": "gf-1"})
    assert isinstance(batch, dataproc_v1.Batch)
    batch = dataproc_v1.Batch.deserialize(dataproc_v1.Batch.serialize(batch))  # survives the wire format
    assert batch.pyspark_batch.main_python_file_uri == "gs://b/main.py"
    assert list(batch.pyspark_batch.args) == ["--rows", "10000000"]
    assert batch.runtime_config.version == "2.1"
    assert dict(batch.runtime_config.properties) == {
        "spark.dataproc.executor.resource.accelerator.type": "l4",
        "spark.dataproc.executor.compute.tier": "premium",
        "spark.dataproc.executor.disk.tier": "premium",
        "spark.dataproc.executor.disk.size": "375g",
        "spark.executor.instances": "2",
        "spark.executor.cores": "4",
        "spark.executor.memory": "8030m",
        "spark.executor.memoryOverhead": "5354m",
        "spark.dataproc.driverEnv.LANG": "C.UTF-8",
        "spark.executorEnv.LANG": "C.UTF-8",
        "spark.shuffle.manager": "com.nvidia.spark.rapids.RapidsShuffleManager",
    }
    assert dict(batch.labels) == {"gpuflow-run": "gf-1"}


def test_a100_batch_request():
    config = load_config(EXAMPLE, overrides=["dataproc.accelerator=a100-80", "dataproc.executor_cores=12",
                                             "dataproc.disk_size=750", "dataproc.executor_memory_overhead=null",
                                             "dataproc.executor_memory=100000"])
    properties = dict(build_batch(config, "gs://b/main.py").runtime_config.properties)
    assert properties["spark.dataproc.executor.resource.accelerator.type"] == "a100-80"
    assert properties["spark.executor.cores"] == "12"
    assert properties["spark.dataproc.executor.disk.size"] == "750g"
    assert (properties["spark.executor.memory"], properties["spark.executor.memoryOverhead"]) == ("100000m", "65080m")
    assert "spark.executorEnv.LANG" not in properties  # runtime 2.2 needs no LANG


def test_shielded_vm_policy_error_is_classified():
    text = ("Batch failed: Constraint constraints/compute.requireShieldedVm violated for project my-project. "
            "Secure Boot is not enabled in the 'shielded_instance_config' field.")
    assert classify(text).code == "SHIELDED_VM_REQUIRED"
