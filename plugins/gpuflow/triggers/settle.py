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
- a trigger yields its event no sooner than ``HOLD_S`` after its task deferred (``run``), so an event that comes
  early is held; a longer wait is not delayed at all.

The hold runs from the deferral, not from the trigger's start: the window opens when the task defers, and a
triggerer that restarts (Composer moves its pods) rebuilds each trigger from its serialized kwargs, whose new
``run`` would otherwise hold its event ``HOLD_S`` again. So a trigger carries ``deferred_at``, the wall-clock time
(epoch seconds: the task and the triggerer are different processes, maybe machines) at which the task handed it to
Airflow: its ``serialize()`` when the task defers, which may come ``HOLD_S`` after the task built it (the worker's
wait above). A restart neither extends nor shortens the hold; a worker clock ahead of the triggerer's does not
stretch it past ``HOLD_S`` from the trigger's start.

``HOLD_S`` is measured, not derived: ``benchmarks/defer_race.py`` counts the race with and without the hold on a
live Airflow under load, and prints how long the scheduler took to read each deferral's exit.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

#: Seconds a task waits for its job in its worker before deferring, and a trigger holds an early event from the
#: deferral. The scheduler read a deferral's exit 5.4 to 6.1 s after it on a 2-core machine with a spinning process
#: per core (the former 5 s hold lost that race; benchmarks/defer_race.py, docs/benchmarks.md): 20 s is three times
#: the slowest read. GPUFLOW_TRIGGER_SETTLE_S overrides it (the test suite's dag.test() runs, which have no
#: scheduler, set 0).
HOLD_S = float(os.environ.get("GPUFLOW_TRIGGER_SETTLE_S", "20"))


def hold_until(settle_s: float, deferred_at: float | None, now: float) -> float:
    """The epoch time before which a trigger yields no event: ``settle_s`` after its deferral (``deferred_at``; None,
    a trigger never handed to Airflow: ``now``), and never more than ``settle_s`` after ``now``."""
    return min(now, now if deferred_at is None else deferred_at) + settle_s


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds")


async def settled(events: AsyncIterator[TriggerEvent], settle_s: float, deferred_at: float | None = None,
                  log: Any = None) -> AsyncIterator[TriggerEvent]:
    """``events``, none yielded before ``hold_until`` (measured when the first is asked for). ``log`` says, for the
    triggerer's log, when the hold ends and when the event goes, each against the deferral."""
    now = time.time()
    deferred = now if deferred_at is None else deferred_at
    hold_s, started = hold_until(settle_s, deferred_at, now) - now, time.monotonic()
    if log is not None:
        log.info("holding events until %s (deferred at %s, %.1fs ago)", _iso(now + hold_s), _iso(deferred),
                 now - deferred)
    async for event in events:
        await asyncio.sleep(max(0.0, hold_s - (time.monotonic() - started)))
        if log is not None:
            released = time.time()
            log.info("releasing the event at %s (%.1fs after the deferral)", _iso(released), released - deferred)
        yield event


def with_carried(payload: dict[str, Any], carried: dict[str, Any] | None) -> dict[str, Any]:
    """An event's payload with what its task carried through the wait (``carried``), for the task's
    ``execute_complete``: the trigger's ``run`` yields it, and a worker's wait (``triggers.event_in_worker``)
    returns it."""
    return {**payload, "carried": carried} if carried else payload


class SettlingTrigger(BaseTrigger):
    """gpuflow's own triggers: ``events()`` is the wait (which a worker may also run itself), ``run()`` holds its
    event until ``settle_s`` after ``deferred_at`` and, on a triggerer that does not call ``on_kill``, calls it when
    the task is killed (``gpuflow.triggers.kill``). ``carried``: what the deferring task needs when it goes on, echoed
    in the event (Airflow's ``dag.test()`` hands ``execute_complete`` the event alone, not the deferral's kwargs).
    ``deferred_at``: None until the task defers, when ``serialize()`` (``_with_settle``) stamps it; a trigger rebuilt
    from those kwargs keeps it."""

    def __init__(self, settle_s: float = HOLD_S, carried: dict[str, Any] | None = None,
                 deferred_at: float | None = None):
        super().__init__()  # type: ignore[no-untyped-call]  # (Airflow's BaseTrigger.__init__ is unannotated)
        self.settle_s, self.carried, self.deferred_at = settle_s, carried, deferred_at

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from gpuflow.triggers.kill import stopping_job_when_killed

        held = settled(self.events(), self.settle_s, self.deferred_at, self.log)
        async for event in stopping_job_when_killed(self, held):
            yield TriggerEvent(with_carried(event.payload, self.carried))

    async def events(self) -> AsyncIterator[TriggerEvent]:
        raise NotImplementedError
        yield  # an async generator

    def _with_settle(self, classpath: str, kwargs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return classpath, {**kwargs, **settle_kwargs(self)}


def settle_kwargs(trigger: Any) -> dict[str, Any]:
    """What every gpuflow trigger adds to its serialized kwargs. ``deferred_at``: its own once set (a rebuilt
    trigger), else now: Airflow serializes a trigger when its task defers (``_defer_task`` in the task SDK's
    ``execution_time/task_runner.py``), which may come ``HOLD_S`` after the task built it, so the time is taken
    then, not in ``__init__``."""
    deferred_at = trigger.deferred_at if trigger.deferred_at is not None else time.time()
    return {"settle_s": trigger.settle_s, "carried": trigger.carried, "deferred_at": deferred_at}
