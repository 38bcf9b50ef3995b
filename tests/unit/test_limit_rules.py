"""The site's limits and the cost estimate (gpuflow.preflight.limit_rules, catalog/prices.yaml): a run over a limit is
refused before anything is created, with the figure and the limit; a limit that needs a figure the catalog lacks
refuses as not checked."""

import pytest

from gpuflow.catalog import machine_price, machine_spec
from gpuflow.configuration.loading import load_config
from gpuflow.preflight import run_preflight
from gpuflow.preflight.limit_rules import estimate, limit_findings

pytestmark = pytest.mark.timeout(60)


def gcp(*overrides):
    return load_config("configs/gcp.example.yaml", overrides=list(overrides))


def errors(config, workflow="inference"):
    return [f for f in limit_findings(config, workflow) if f.level == "error"]


def test_the_catalog_prices_two_gpu_types_in_one_region_each_with_its_source():
    l4, a100 = machine_price("us-central1", "g2-standard-4"), machine_price("us-central1", "a2-highgpu-1g")
    assert l4 and a100 and l4.usd_per_hour < a100.usd_per_hour
    assert {machine_spec("g2-standard-4").fixed_gpu, machine_spec("a2-highgpu-1g").fixed_gpu} == {
        "nvidia-l4", "nvidia-tesla-a100"}
    for price in (l4, a100):
        assert "Cloud Billing Catalog API" in price.source and price.read == "2026-12-03"
    assert machine_price("us-central1", "n1-standard-4") is None  # not read: never a guess


def test_a_run_over_max_usd_per_hour_is_refused_with_both_figures():
    config = gcp("worker.max_num_workers=4", "gpu.machine_type=g2-standard-4", "region=us-central1",
                 "limits.max_usd_per_hour=2")
    peak = estimate(config, "inference")
    assert peak.usd_per_hour == pytest.approx(4 * 0.706832255)
    (refused,) = errors(config)
    assert "$2.83 per hour" in refused.problem and "$2" in refused.problem and "Cloud Billing" in refused.problem
    a100 = gcp("gpu.type=nvidia-tesla-a100", "gpu.machine_type=a2-highgpu-1g", "region=us-central1",
               "limits.max_usd_per_hour=2")
    assert "$3.67 per hour" in errors(a100)[0].problem


def test_a_run_within_the_limits_passes_and_its_estimate_is_logged():
    config = gcp("worker.max_num_workers=2", "gpu.machine_type=g2-standard-4", "region=us-central1",
                 "limits.max_usd_per_hour=2", "limits.max_gpus=2",
                 "limits.gpu_types=[nvidia-l4]")
    findings = list(limit_findings(config, "inference"))
    assert [f.level for f in findings] == ["info"]
    assert "$1.41 per hour" in findings[0].problem and "2 GPUs at the peak" in findings[0].problem


def test_a_limit_that_needs_a_figure_the_catalog_lacks_is_not_checked_and_refuses():
    config = gcp("gpu.type=nvidia-tesla-t4", "gpu.machine_type=n1-standard-8", "limits.max_usd_per_hour=100")
    (refused,) = errors(config)
    assert refused.problem.startswith("not checked") and "n1-standard-8" in refused.problem


@pytest.mark.parametrize(("overrides", "field"), [
    (["worker.max_num_workers=1000", "gpu.count=1", "limits.max_gpus=8"], "limits.max_gpus"),
    (["gpu.type=nvidia-h100-80gb", "gpu.machine_type=a3-highgpu-8g", "limits.gpu_types=[nvidia-l4]"], "gpu.type"),
    (["batch.job_timeout_s=100000", "limits.max_job_hours=6"], "batch.job_timeout_s"),
    (["deployment.mode=persistent", "deployment.name=prod", "limits.max_job_hours=6"], "deployment.mode"),
    (["deployment.mode=persistent", "deployment.name=prod", "limits.lasting_deployments=false"], "deployment.mode"),
    (["dataflow.poll_interval_s=1e-9"], "dataflow.poll_interval_s"),
    (["region=europe-west4", "limits.regions=[us-central1]"], "region"),
])
def test_each_limit_refuses_a_run_above_it(overrides, field):
    assert [f.field for f in errors(gcp(*overrides))] == [field]


def test_dataproc_executors_are_bounded_and_their_price_is_not_read():
    config = load_config("configs/dataproc.example.yaml",
                         overrides=["dataproc.executor_instances=100000", "limits.max_dataproc_executors=10"])
    assert [f.field for f in errors(config, "dataproc")] == ["dataproc.executor_instances"]
    peak = estimate(config, "dataproc")
    assert peak.gpus == 100000 and peak.usd_per_hour is None and peak.unread


def test_preflight_runs_the_limits():
    config = gcp("limits.max_gpus=1", "worker.max_num_workers=3")
    assert "limits.max_gpus" in {f.field for f in run_preflight(config, check_environment=False)}
