"""Print the latest llm_streaming_inference run from Airflow's metadata DB: each task's state and time, then the
prompts and answers.

Used by ``make demo`` after ``airflow dags test``, whose full log it names; exits non-zero when that run did not
succeed.
"""

from __future__ import annotations

import sys
from typing import Any

from gpuflow.workflow_names import SMOKE_TEST_TASK

DAG_ID = "llm_streaming_inference"
#: Beam's DirectRunner holds its Pub/Sub pull open up to 30 s on an empty subscription (the local pipeline shortens
#: it: beam_jobs/direct_runner_pull.py); an answer this late locally waited for it.
DIRECT_RUNNER_PULL_S = 30.0


def straggler_note(answers: list[dict[str, Any]]) -> str | None:
    """Why an answer of the local demo came about 30 s late, when one did: the runner, not the model."""
    late = [a for a in answers if a["latency_s"] >= DIRECT_RUNNER_PULL_S * 0.8]
    if not late:
        return None
    return (f"{len(late)} answer(s) took {min(a['latency_s'] for a in late):.0f}s or more: Beam's DirectRunner runs on "
            f"one thread and blocks up to {DIRECT_RUNNER_PULL_S:.0f}s in its Pub/Sub pull once the subscription is "
            "empty, which delays the batching timer of the last prompts of a burst. Dataflow does not (docs/"
            "troubleshooting.md).")


def slowest_answer(answers: list[dict[str, Any]]) -> str:
    slowest = max(answers, key=lambda answer: answer["latency_s"])
    return f"slowest answer: {slowest['latency_s']:.1f}s (prompt {slowest['id']})"


def format_task_table(rows: list[tuple[str, str, float | None]]) -> str:
    """Each task's state and how long it ran, in the order they started."""
    width = max((len(task) for task, _, _ in rows), default=4)
    lines = [f"{'task':<{width}}  {'state':<16} seconds"]
    lines += [f"{task:<{width}}  {state:<16} {'' if seconds is None else f'{seconds:7.1f}'}"
              for task, state, seconds in rows]
    return "\n".join(lines)


def run_tasks(dag_id: str, run_id: str) -> list[tuple[str, str, float | None]]:
    """(task, state, seconds) of each task of the run, in the order they started."""
    from airflow.models import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        instances = session.query(TaskInstance).filter(TaskInstance.dag_id == dag_id,
                                                       TaskInstance.run_id == run_id).all()
        rows = [(ti.task_id, str(ti.state), ti.start_date,
                 (ti.end_date - ti.start_date).total_seconds() if ti.start_date and ti.end_date else None)
                for ti in instances]
    rows.sort(key=lambda row: (row[2] is None, row[2] or 0))
    return [(task, state, seconds) for task, state, _, seconds in rows]


def latest_run_answers(dag_id: str = DAG_ID) -> tuple[str, str, dict[str, Any] | None]:
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
                    XComModel.task_id == SMOKE_TEST_TASK, XComModel.key == "return_value")
            .first()
        )
        return run.run_id, str(run.state), (XComModel.deserialize_value(row) if row else None)


def main(argv: list[str] | None = None) -> int:
    from gpuflow.steps.smoke import format_answers_table

    run_id, state, result = latest_run_answers()
    print(f"\n=== {DAG_ID} run {run_id}: {state} ===")
    if run_id:
        print(format_task_table(run_tasks(DAG_ID, run_id)) + "\n")
    if result:
        print(f"{result['answered']}/{result['sent']} prompts answered by the streaming pipeline:\n")
        print(format_answers_table(result["answers"]))
        if result["answers"]:
            print(f"\n{slowest_answer(result['answers'])}")
        if note := straggler_note(result["answers"]):
            print(f"\n{note}")
    else:
        print("no smoke-test answers recorded; see the tasks' logs")
    if argv:
        print(f"\nfull log: {argv[0]}")
    return 0 if state == "success" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
