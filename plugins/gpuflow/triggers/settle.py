"""Holding a trigger's event until the deferred task's own exit is surely known to the scheduler.

Airflow 3.3.2's scheduler fails a deferred task whose trigger fires before it has processed the executor's report
that the deferring process exited ("finished with state success, but the task instance's state attribute is
queued": apache/airflow issues #67287 and #72716; its guard covers only a task already back in ``scheduled``). A
local GPU check that ends within seconds hit it. So each gpuflow trigger yields its event no sooner than
``settle_s`` after it started; waits that last longer are not delayed at all.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

#: Seconds a trigger holds an early event: several scheduler loops. GPUFLOW_TRIGGER_SETTLE_S overrides it (the
#: test suite's dag.test() runs, which have no scheduler, set 0).
SETTLE_S = float(os.environ.get("GPUFLOW_TRIGGER_SETTLE_S", "5"))


async def settled(events: AsyncIterator[TriggerEvent], settle_s: float) -> AsyncIterator[TriggerEvent]:
    """``events``, each yielded no sooner than ``settle_s`` after the first was asked for."""
    started = time.monotonic()
    async for event in events:
        await asyncio.sleep(max(0.0, settle_s - (time.monotonic() - started)))
        yield event


class SettlingTrigger(BaseTrigger):
    """gpuflow's own triggers: ``events()`` is the wait, ``run()`` holds its event for ``settle_s`` and, on a
    triggerer that does not call ``on_kill``, calls it when the task is killed (``gpuflow.triggers.kill``)."""

    def __init__(self, settle_s: float = SETTLE_S):
        super().__init__()
        self.settle_s = settle_s

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from gpuflow.triggers.kill import stopping_job_when_killed

        async for event in stopping_job_when_killed(self, settled(self.events(), self.settle_s)):
            yield event

    async def events(self) -> AsyncIterator[TriggerEvent]:
        raise NotImplementedError
        yield  # an async generator

    def _with_settle(self, classpath: str, kwargs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return classpath, {**kwargs, "settle_s": self.settle_s}
