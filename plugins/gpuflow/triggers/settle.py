"""No trigger fires before the scheduler has read the deferring worker's exit: Airflow's defer-exit race.

A task that defers ends its worker process, and the executor reports that exit as ``success`` for the same try. The
scheduler reads the report in ``SchedulerJobRunner.process_executor_events`` (``airflow/jobs/scheduler_job_runner.py``),
once per scheduling loop, right after the executors' heartbeat has collected it (LocalExecutor: its result queue;
CeleryExecutor, Composer's: the result backend). It fails the task ("... finished with state success, but the task
instance's state attribute is ..." then ``handle_failure``: a retry, or a failed run on the last try) when, by then,
the task instance is in that same try, ``ti_queued`` and not ``ti_requeued``:

- Airflow 3.1.8 (Composer's floor): ``ti_queued`` is scheduled, queued, running or restarting; ``ti_requeued`` is
  "queued by another scheduler" or ``executor.has_task(ti)``, and the stale report has just taken the task's key out
  of the executor's running set (``BaseExecutor.change_state``), so a resumed task is neither.
- Airflow 3.3.2: the same, except that a task back in ``scheduled`` with ``next_method`` set counts as resumed after
  deferral (apache/airflow#66374, fixed in 3.2.2); ``queued`` (#67287) and ``running`` (#71580, #72716) still fail.

On both lines a report read while the task instance is still ``deferred`` does nothing. So a trigger must not fire
until the worker has exited, the executor has collected the exit, and a scheduling loop has read it. Nothing a trigger
can read records that moment (the scheduler only logs "TaskInstance Finished: ... state=deferred"), so gpuflow keeps
every event out of that window, ``HOLD_S`` long:

- a task first waits up to ``HOLD_S`` for its job in its own worker (``JobWaitingOperator.wait_for``, with the
  trigger's ``events``): a job done by then completes in ``execute`` and nothing defers;
- a trigger yields its event no sooner than ``HOLD_S`` after it started (``run``), so an event that comes early is
  held; a longer wait is not delayed at all.

``HOLD_S`` is measured, not derived: ``benchmarks/defer_race.py`` counts the race with and without the hold on a
live Airflow under load, and prints how long the scheduler took to read each deferral's exit.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

#: Seconds a task waits for its job in its worker before deferring, and a trigger holds an early event. The scheduler
#: read a deferral's exit 5.4 to 6.1 s after it on a 2-core machine with a spinning process per core (the former 5 s
#: hold lost that race; benchmarks/defer_race.py, docs/benchmarks.md): 20 s is three times the slowest read.
#: GPUFLOW_TRIGGER_SETTLE_S overrides it (the test suite's dag.test() runs, which have no scheduler, set 0).
HOLD_S = float(os.environ.get("GPUFLOW_TRIGGER_SETTLE_S", "20"))


async def settled(events: AsyncIterator[TriggerEvent], settle_s: float) -> AsyncIterator[TriggerEvent]:
    """``events``, each yielded no sooner than ``settle_s`` after the first was asked for."""
    started = time.monotonic()
    async for event in events:
        await asyncio.sleep(max(0.0, settle_s - (time.monotonic() - started)))
        yield event


def with_carried(payload: dict[str, Any], carried: dict[str, Any] | None) -> dict[str, Any]:
    """An event's payload with what its task carried through the wait (``carried``), for the task's
    ``execute_complete``: the trigger's ``run`` yields it, and a worker's wait (``triggers.event_in_worker``)
    returns it."""
    return {**payload, "carried": carried} if carried else payload


class SettlingTrigger(BaseTrigger):
    """gpuflow's own triggers: ``events()`` is the wait (which a worker may also run itself), ``run()`` holds its
    event for ``settle_s`` and, on a triggerer that does not call ``on_kill``, calls it when the task is killed
    (``gpuflow.triggers.kill``). ``carried``: what the deferring task needs when it goes on, echoed in the event
    (Airflow's ``dag.test()`` hands ``execute_complete`` the event alone, not the deferral's kwargs)."""

    def __init__(self, settle_s: float = HOLD_S, carried: dict[str, Any] | None = None):
        super().__init__()  # type: ignore[no-untyped-call]  # (Airflow's BaseTrigger.__init__ is unannotated)
        self.settle_s, self.carried = settle_s, carried

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from gpuflow.triggers.kill import stopping_job_when_killed

        async for event in stopping_job_when_killed(self, settled(self.events(), self.settle_s)):
            yield TriggerEvent(with_carried(event.payload, self.carried))

    async def events(self) -> AsyncIterator[TriggerEvent]:
        raise NotImplementedError
        yield  # an async generator

    def _with_settle(self, classpath: str, kwargs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return classpath, {**kwargs, "settle_s": self.settle_s, "carried": self.carried}
