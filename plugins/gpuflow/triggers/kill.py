"""A kill while deferred cancels the job on every Airflow line gpuflow supports.

Airflow 3.3's triggerer calls a trigger's ``on_kill`` when a user acts on the deferred task (mark failed, mark
success, clear): ``TriggerRunner.run_trigger`` in ``airflow/jobs/triggerer_job_runner.py``, for a cancel that
carries ``_USER_ACTION_CANCEL_MSG``. The 3.1 triggerer (Composer's floor, 3.1.8) never calls ``on_kill``: it cancels
the trigger's asyncio task, for a user's action and for its own shutdown alike. There, as the provider's BigQuery and
Dataproc triggers do (``safe_to_cancel`` in apache-airflow-providers-google 22.8.0's ``cloud/triggers/bigquery.py``
and ``cloud/triggers/dataproc.py``; its Dataflow triggers have none), a gpuflow trigger calls its own ``on_kill`` on
``CancelledError`` only after asking Airflow that its task instance has left the deferred state: a triggerer that
restarts (Composer moves its pods in upgrades and maintenance) must leave a healthy job running, for the next
triggerer to wait on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import TriggerEvent


def _triggerer_calls_on_kill() -> bool:
    from airflow import __version__
    from packaging.version import Version

    return Version(__version__).release[:2] >= (3, 3)


#: Whether this Airflow's triggerer calls ``on_kill`` itself (3.3 and later); if not, gpuflow's triggers do.
TRIGGERER_CALLS_ON_KILL = _triggerer_calls_on_kill()


async def task_left_deferral(trigger: Any) -> bool:
    """Whether the trigger's task instance is, by Airflow's record, no longer deferred (a user acted on it).

    Read through the triggerer's supervisor, as the provider's ``safe_to_cancel`` does; an instance Airflow cannot
    find counts as still deferred, so that nothing is cancelled on a doubt (the run's cleanup and the janitor stop a
    job left behind)."""
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance
    from asgiref.sync import sync_to_async

    ti = getattr(trigger, "task_instance", None)
    if ti is None:
        return False
    states = await sync_to_async(RuntimeTaskInstance.get_task_states)(
        dag_id=ti.dag_id, task_ids=[ti.task_id], run_ids=[ti.run_id], map_index=ti.map_index)
    state = (states.get(ti.run_id) or {}).get(ti.task_id)
    return state is not None and state != "deferred"


async def stopping_job_when_killed(trigger: Any, events: AsyncIterator[TriggerEvent]) -> AsyncIterator[TriggerEvent]:
    """``events``; when the wait is cancelled by a triggerer that does not call ``on_kill``, the trigger's
    ``on_kill`` if its task has left deferral. The cancel itself always goes on (re-raised)."""
    try:
        async for event in events:
            yield event
    except asyncio.CancelledError:
        on_kill = getattr(trigger, "on_kill", None)
        if not TRIGGERER_CALLS_ON_KILL and on_kill is not None and getattr(trigger, "cancel_on_kill", True):
            # Shielded: the 3.1 triggerer cancels a trigger again at each of its loops until the trigger's task has
            # ended, which would cut this check and the job's cancel short; shielded, they finish in its event loop.
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(_kill_if_task_left(trigger, on_kill))
        raise


async def _kill_if_task_left(trigger: Any, on_kill: Any) -> None:
    try:
        if await task_left_deferral(trigger):
            trigger.log.info("the deferred task was killed: cancelling its job")
            await on_kill()
        else:
            trigger.log.info("the triggerer stopped while the task is still deferred: its job goes on")
    except Exception:  # the cancel must not be lost to a failed cleanup; the janitor stops what is left
        trigger.log.exception("cancelling the job of a killed task failed")
