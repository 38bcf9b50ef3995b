"""The operator of gpu_quota_report."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from gpuflow.operators.airflow_names import AirflowFailException
from gpuflow.operators.base import fail_on_errors
from gpuflow.operators.run_config import config_from_params

if TYPE_CHECKING:
    from gpuflow.configuration.model import GpuflowConfig

log = logging.getLogger(__name__)


class GpuQuotaReportOperator(BaseOperator):
    """Reads GPU quota headroom (gcp: Compute Engine, each configured region) or this machine's GPUs (local:
    nvidia-smi and torch); warns when it is below what inference needs. It waits for nothing."""

    execution_timeout_from = "short"  # its execution_timeout: gpuflow.runs.task_timeouts

    ui_color = "#fff3cd"

    def execute(self, context: Any) -> dict[str, Any]:
        from gpuflow.gpus.quota import compute_clients, format_quota, gpu_quota
        from gpuflow.steps.quota import local_gpu_report

        config = config_from_params(context)
        if not config.traits.gpu_quota:  # this machine's GPUs
            report = local_gpu_report(config)
            if report["count"] == 0 and not report["torch_cuda_devices"]:
                log.warning("no GPU on this machine (%s); the local profile runs inference on CPU",
                            report.get("note", "nvidia-smi lists none"))
            else:
                log.info("local GPUs: %s", report["gpus"])
            return {"profile": "local", **report}
        self._check_access(config)
        readings = gpu_quota(config, compute_clients(**config.hook_identity()))
        log.info("GPU quota for %s:\n%s", config.project, format_quota(readings))
        for reading in readings:
            if not reading.known:
                log.warning("%s %s: unknown. Fix: %s", reading.region, reading.metric, reading.fix)
            elif reading.enough is False:
                log.warning(
                    "%s: %g %s free, but llm_streaming_inference needs %d (gpu.count x worker.max_num_workers). "
                    "Fix: request more quota or lower worker.max_num_workers.",
                    reading.region, reading.headroom, reading.metric, reading.needed,
                )
        return {"profile": "gcp", "readings": [r.as_dict() for r in readings]}

    @staticmethod
    def _check_access(config: GpuflowConfig) -> None:
        """The quota reads' own APIs and permissions first: a refused read then names its fix instead of a 403."""
        from gpuflow.platform import get_platform
        from gpuflow.preflight.access_rules import access_findings

        probe = get_platform(config).access_probe()
        if probe is None:  # a quota-reading platform with no project to read: nothing checked is not "ok"
            raise AirflowFailException(f"access for the quota report: not checked (the {config.profile} profile's "
                                       "platform reads no Google Cloud project). Fix: use the gcp profile.")
        fail_on_errors(access_findings(config, "quota_report", probe), "access for the quota report")
