"""What gpuflow's DAGs need from the Cloud Composer environment they run in, read through the provider's
``CloudComposerHook`` (``platform.composer_api.environment_facts``): an image at or above gpuflow's floor, and a
triggerer wherever one of the DAG's tasks defers. Composer runs deferred tasks only "if you have at least one
triggerer instance" (docs.cloud.google.com/composer/docs/composer-3/use-deferrable-operators): without one, a run
would wait at its first deferral for ever. Which tasks defer is read from the DAG as parsed (each task's
``deferrable``: by default Airflow's ``[operators] default_deferrable``), not assumed. (The pool is
``pool_rules``'.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gpuflow.preflight.findings import Finding, error, info, unknown


def composer_findings(facts: dict[str, Any]) -> Iterator[Finding]:
    from gpuflow.composer.contents import image_too_old

    if facts.get("problem"):
        yield unknown("composer", f"could not read this Composer environment ({facts['problem']})",
                      "check that the connection's identity may read the environment (roles/composer.user)")
        return
    too_old = image_too_old(facts["image"])
    if too_old:
        problem, _, fix = too_old.partition(". Fix: ")
        yield error("composer", problem, fix)
    deferring, in_worker = facts["deferring_tasks"], facts["worker_waiting_tasks"]
    if deferring and facts["triggerers"] == 0:
        yield error("composer", f"the environment has no Airflow triggerer, and {_tasks(deferring)} of this DAG "
                    "defer: this run would wait at its first deferral for ever",
                    "gcloud composer environments update ENVIRONMENT --location LOCATION --triggerer-count 1 "
                    "(docs.cloud.google.com/composer/docs/composer-3/use-deferrable-operators)")
    elif deferring and facts["triggerers"] is None:
        yield unknown("composer", "the environment's description states no triggerer count",
                      "check in the console (Environment configuration > Workloads) that it runs a triggerer")
    if in_worker:
        yield info("composer", f"{_tasks(in_worker)} of this DAG wait for their jobs in worker slots "
                   "(deferrable=False; by default Airflow's [operators] default_deferrable, false unless set)",
                   "to free the slots while jobs run, with a triggerer: gcloud composer environments update "
                   "ENVIRONMENT --location LOCATION --update-airflow-configs=operators-default_deferrable=True "
                   "(cloud.google.com/composer/docs/overriding-airflow-configurations)")


def _tasks(task_ids: list[str]) -> str:
    shown = ", ".join(task_ids[:4]) + (f" and {len(task_ids) - 4} more" if len(task_ids) > 4 else "")
    return f"task{'s' if len(task_ids) > 1 else ''} {shown}"
