"""The Airflow DAG gpu_quota_report, made from configs/local.yaml (``gpuflow.site_dags.gpu_quota_report`` says what it does).

Where this folder holds site folders (``<site>/gpuflow_site.py``: ``gpuflow site-dags``), their DAGs replace it.
"""

from __future__ import annotations

from pathlib import Path

# The airflow.* modules it uses, which the dag-processor imports once, before it forks each parse.
import airflow.sdk  # noqa: F401

from gpuflow.site_dags import local_dags

globals().update(local_dags("gpu_quota_report", Path(__file__).parent))
