"""The console links of the jobs gpuflow starts, read from the URLs its tasks push to XCom.

Not the provider's ``BaseGoogleLink`` subclasses (apache-airflow-providers-google 22.8.0), though they would serve:
any operator may call ``persist``, and ``get_link`` gives "" when nothing is stored (the local profile's jobs).
For parse cost: an operator's links load when its DAG file is parsed, and the dag-processor pre-imports only the
``airflow.*`` modules the DAG file itself names, so links named in gpuflow's operator modules would load 22.8.0's
``links.base`` (612 modules, about 300 ms) in every forked parse (``tests/unit/test_provider_gaps.py`` fails when
that shrinks; Composer's 22.2.0 loads 12). These classes carry names of their own, so that no reader takes them for
the provider's.

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


class RolloutGatePageLink(XComUrlLink):
    """The rollout gate's page (both versions' figures and the decision) in the deployment's folder."""

    name = "Rollout gate"
    source_key = "rollout_gate_url"
