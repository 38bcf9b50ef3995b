"""The console links of the jobs gpuflow starts, read from the URLs its tasks push to XCom.

A module of its own: Airflow's BaseOperatorLink is an attrs class whose import costs about a millisecond of
every parse, so only the DAGs whose operators have links import it.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperator, BaseOperatorLink


class XComUrlLink(BaseOperatorLink):
    """A console link the task pushed to XCom (a URL, or a job handle with its ``url``)."""

    name = ""
    source_key = ""

    def get_link(self, operator: BaseOperator, *, ti_key: Any) -> str:
        from airflow.sdk.bases.xcom import BaseXCom as XCom

        value = XCom.get_value(ti_key=ti_key, key=self.source_key)
        if isinstance(value, dict):
            value = value.get("url")
        return value if isinstance(value, str) and value.startswith("https://") else ""


class DataflowJobLink(XComUrlLink):
    name = "Dataflow job"
    source_key = "job_handle"


class VertexAIJobLink(XComUrlLink):
    name = "Vertex AI job"
    source_key = "vertex_job_url"


class CloudBuildLink(XComUrlLink):
    name = "Cloud Build"
    source_key = "cloud_build_url"


class DataprocBatchLink(XComUrlLink):
    name = "Dataproc batch"
    source_key = "dataproc_batch_url"
