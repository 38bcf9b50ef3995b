"""Print the prompts and answers of the latest llm_streaming_inference run from Airflow's metadata DB.

Used by ``make demo`` after ``airflow dags test``; exits non-zero when that run did not succeed.
"""

from __future__ import annotations

import sys

DAG_ID = "llm_streaming_inference"


def latest_run_answers(dag_id: str = DAG_ID) -> tuple[str, str, dict | None]:
    from airflow.models import DagRun
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        run = session.query(DagRun).filter(DagRun.dag_id == dag_id).order_by(DagRun.id.desc()).first()
        if run is None:
            return "", "no run", None
        row = (
            session.query(XComModel)
            .filter(XComModel.dag_id == dag_id, XComModel.run_id == run.run_id,
                    XComModel.task_id == "smoke_test", XComModel.key == "return_value")
            .first()
        )
        return run.run_id, str(run.state), (XComModel.deserialize_value(row) if row else None)


def main(argv: list[str] | None = None) -> int:
    from gpuflow.steps.smoke import format_answers_table

    run_id, state, result = latest_run_answers()
    print(f"\n=== {DAG_ID} run {run_id}: {state} ===")
    if result:
        print(f"{result['answered']}/{result['sent']} prompts answered by the streaming pipeline:\n")
        print(format_answers_table(result["answers"]))
    else:
        print("no smoke-test answers recorded; see the task logs above")
    return 0 if state == "success" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
