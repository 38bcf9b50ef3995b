"""The console links of the jobs gpuflow starts, read from the URLs its tasks push to XCom.

Not the provider's link classes (apache-airflow-providers-google 22.8.0: ``DataflowJobLink``,
``VertexAITrainingLink``, ``CloudBuildLink``, ``DataprocBatchLink``). Not for parse cost: an operator's links load
when its DAG file is parsed, but the dag-processor pre-imports only the ``airflow.*`` modules the DAG file itself
names, and links named in gpuflow's operator modules would load the provider (613 modules) in every forked parse;
named in a DAG file, a stock link parsed at 1.13 times a bare one-task DAG (docs/benchmarks.md). The provider's
classes build the URL from what its own operators persist (project, region, job id), and have no empty link for
the local profile's jobs. These classes carry names of their own, so that no reader takes them for the provider's.

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


class DataflowConsoleLink(XComUrlLink):
    name = "Dataflow job"
    source_key = "job_handle"


class VertexAIConsoleLink(XComUrlLink):
    name = "Vertex AI job"
    source_key = "vertex_job_url"


class CloudBuildConsoleLink(XComUrlLink):
    name = "Cloud Build"
    source_key = "cloud_build_url"


class DataprocConsoleLink(XComUrlLink):
    name = "Dataproc batch"
    source_key = "dataproc_batch_url"
