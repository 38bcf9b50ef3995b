"""The Composer rules read which of the DAG's tasks defer (``task_deferrals``), not assume it."""

from __future__ import annotations

import pytest
from airflow.sdk import DAG

from gpuflow.operators.base import task_deferrals
from gpuflow.operators.streaming import CleanupOperator, QuotaCheckOperator, SmokeTestOperator
from gpuflow.preflight.composer_rules import composer_findings
from gpuflow.preflight.findings import has_errors

IMAGE = "composer-3-airflow-3.1.8-build.3"


def facts_for(deferrable: bool, triggerers: int | None) -> dict:
    with DAG("t", schedule=None) as dag:
        QuotaCheckOperator(task_id="check_quota")
        SmokeTestOperator(task_id="smoke_test", deferrable=deferrable)
        CleanupOperator(task_id="cleanup", deferrable=deferrable)
    return {"image": IMAGE, "triggerers": triggerers, **task_deferrals(dag)}


def test_the_tasks_that_defer_and_those_that_wait_in_their_slots_are_read_from_the_dag():
    assert task_deferrals(DAG("empty", schedule=None)) == {
        "deferring_tasks": [], "worker_waiting_tasks": []}
    deferring = facts_for(True, 1)
    assert (deferring["deferring_tasks"], deferring["worker_waiting_tasks"]) == (["cleanup", "smoke_test"], [])
    waiting = facts_for(False, 1)
    assert (waiting["deferring_tasks"], waiting["worker_waiting_tasks"]) == ([], ["cleanup", "smoke_test"])


@pytest.mark.parametrize(("deferrable", "triggerers", "refused", "says"), [
    (True, 0, True, "has no Airflow triggerer, and tasks cleanup, smoke_test of this DAG defer"),
    (True, None, False, "states no triggerer count"),
    (True, 1, False, None),
    (False, 0, False, "wait for their jobs in worker slots"),
])
def test_no_triggerer_refuses_a_run_only_when_one_of_its_tasks_defers(deferrable, triggerers, refused, says):
    findings = list(composer_findings(facts_for(deferrable, triggerers)))
    assert has_errors(findings) is refused
    text = " ".join(f"{finding.problem} {finding.fix}" for finding in findings)
    if says is None:
        assert findings == []
    else:
        assert says in text
    if not deferrable:  # the fix names the Composer override that makes them defer
        assert "--update-airflow-configs=operators-default_deferrable=True" in text
