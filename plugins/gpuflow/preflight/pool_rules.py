"""The Airflow pool of the tasks that start GPU jobs must exist: Airflow's scheduler never runs a task whose pool
does not, so a run would wait at its first GPU task, silently, for ever. Where preflight can read the pools (on
Cloud Composer, through the environment's Airflow REST API: ``platform.composer_api``), a missing one fails the
run at once, with the command that creates it."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from gpuflow.preflight.findings import Finding, error, unknown

#: The workflows whose tasks run in the GPU pool (the GPU check, the launch, the batch job, the Dataproc batch).
POOL_WORKFLOWS = ("inference", "batch", "dataproc")

#: Reads a pool by name: ("exists" | "missing" | "unknown", what was read).
PoolReader = Callable[[str], tuple[str, str]]


def pool_findings(workflow: str, pool: str, read: PoolReader) -> Iterator[Finding]:
    if workflow not in POOL_WORKFLOWS:
        return
    state, detail = read(pool)
    if state == "missing":
        yield error("pool", f"the Airflow pool {pool!r} does not exist, and Airflow never runs a task whose pool "
                    "does not: this run would wait at its first GPU task for ever",
                    "create it: make deploy-composer ENV=ENVIRONMENT LOCATION=REGION (it creates the pool, 1 slot, "
                    f"deferred tasks counted), or in the Airflow UI, Admin > Pools: {pool}, 1 slot, include "
                    "deferred")
    elif state == "unknown":
        yield unknown("pool", f"could not read the Airflow pool {pool!r} ({detail})",
                      f"check that Admin > Pools in the Airflow UI lists {pool}")
