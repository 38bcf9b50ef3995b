"""The Airflow DAG dataproc_gpu_batch, made from configs/dataproc.example.yaml (``gpuflow.site_dags.dataproc_gpu_batch`` says what it does).

Where this folder holds site folders (``<site>/gpuflow_site.py``: ``gpuflow site-dags``), their DAGs replace it.
"""

from __future__ import annotations

from pathlib import Path

# The airflow.* modules it uses, which the dag-processor imports once, before it forks each parse.
import airflow.providers.google.cloud.operators.dataproc  # noqa: F401  (its batch task's operator)
import airflow.sdk  # noqa: F401

from gpuflow.site_dags import local_dags

globals().update(local_dags("dataproc_gpu_batch", Path(__file__).parent))
