"""The Cloud Monitoring reads behind the smoke test's GPU-usage check, and what their points say.

Dataflow writes a job's GPU metrics with a delay, so the read is repeated until both series have points in the
test's window; the smoke test defers meanwhile (``gpuflow.triggers.monitoring``). Provider gap
(apache-airflow-providers-google 22.8.0): its CloudMonitoringHook manages alert policies and notification channels
only (no ``list_time_series``), and it has no Monitoring trigger, so the trigger uses the Monitoring client made like
gpuflow's others.
"""

from __future__ import annotations

from typing import Any

#: The readings the check needs: guide 000's "GPU utilization" and "GPU memory utilization".
LABELS = ("utilization", "memory_utilization")


def metric_requests(project: str, metrics: dict[str, str], job_id: str, started: float, ended: float) -> dict[str, Any]:
    """One ListTimeSeriesRequest per reading (``metrics``: label -> metric type) over [started, ended]."""
    from google.cloud import monitoring_v3

    from gpuflow.dataflow.options import gpu_metric_filter

    interval = monitoring_v3.TimeInterval(start_time={"seconds": int(started)}, end_time={"seconds": int(ended) + 1})
    return {label: monitoring_v3.ListTimeSeriesRequest(
        name=f"projects/{project}", filter=gpu_metric_filter(metric, job_id), interval=interval,
        view=monitoring_v3.ListTimeSeriesRequest.TimeSeriesView.FULL) for label, metric in metrics.items()}


def point_values(series: list[Any]) -> list[float]:
    """The points' values as fractions: the metrics are INT64 percent (the metrics list), read like nvidia-smi's."""
    return [(point.value.int64_value or point.value.double_value) / 100 for one in series for point in one.points]


def usage_summary(job_id: str, readings: dict[str, list[float]]) -> dict[str, Any]:
    return {"source": "cloud-monitoring", "job_id": job_id, "samples": len(readings["utilization"]),
            "max_utilization": max(readings["utilization"]),
            "mean_utilization": sum(readings["utilization"]) / len(readings["utilization"]),
            "max_memory_utilization": max(readings["memory_utilization"])}


def no_readings(job_id: str, timeout_s: float) -> dict[str, Any]:
    return {"source": "cloud-monitoring", "job_id": job_id, "samples": 0,
            "note": f"no GPU metrics for job {job_id} within {timeout_s:.0f}s"}
