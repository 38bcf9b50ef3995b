"""Cloud Monitoring: the GPU-usage time series of a Dataflow job."""

from __future__ import annotations

from typing import Any

from google.cloud import dataflow_v1beta3, monitoring_v3

JobState = dataflow_v1beta3.JobState
Importance = dataflow_v1beta3.JobMessageImportance


class FakeMonitoring:
    """Cloud Monitoring's MetricService: ListTimeSeries answers a GPU metric's points for the asked job.

    ``utilization`` and ``memory`` are the values of every point, in percent (INT64, as the metrics list gives
    them); ``empty_polls`` answers that many polls with no series first, as Monitoring does while metrics lag.
    Series are keyed as Dataflow writes them: resource ``dataflow_job``, the job id as the metric label."""

    def __init__(self, utilization: int = 63, memory: int = 41, empty_polls: int = 1, points: int = 4):
        self.utilization, self.memory, self.empty_polls, self.points = utilization, memory, empty_polls, points
        self.requests: list[Any] = []

    def list_time_series(self, request):
        assert isinstance(request, monitoring_v3.ListTimeSeriesRequest)
        assert request.view == monitoring_v3.ListTimeSeriesRequest.TimeSeriesView.FULL
        self.requests.append(request)
        if self.empty_polls > 0:
            self.empty_polls -= 1 if "memory" in request.filter else 0
            return []
        metric_type = request.filter.split('"')[1]
        if metric_type not in ("dataflow.googleapis.com/job/gpu_utilization",
                               "dataflow.googleapis.com/job/gpu_memory_utilization"):
            return []  # Monitoring answers an unknown metric type with no series
        if 'resource.type = "dataflow_job"' not in request.filter or "metric.labels.job_id = " not in request.filter:
            return []  # the series carry the job id as a metric label on dataflow_job only
        value = self.memory if "memory" in metric_type else self.utilization
        job_id = request.filter.rsplit('metric.labels.job_id = "', 1)[1].rstrip('"')
        start = request.interval.start_time
        return [monitoring_v3.TimeSeries(
            metric={"type": metric_type, "labels": {"job_id": job_id}},
            resource={"type": "dataflow_job", "labels": {"project_id": "p", "job_name": "j", "region": "us-central1"}},
            points=[monitoring_v3.Point(interval={"end_time": {"seconds": int(start.timestamp()) + 60 * i}},
                                        value={"int64_value": value}) for i in range(self.points)],
        )]
