"""gpuflow's triggers: where a task waits for a job without holding a worker slot.

A task starts its job, pushes the handle, then defers to the trigger for the job's kind:
- Dataflow (gcp): ``DataflowJobStateTrigger`` on the provider's ``AsyncDataflowHook`` (workers started, job done or
  stopped, with the zone-exhaustion fail-fast: the provider's Dataflow triggers wait for a job state only);
- Vertex AI custom jobs and Cloud Build (gcp): the provider's ``CustomJobTrigger`` and
  ``CloudBuildCreateBuildTrigger``, with ``on_kill`` and a timeout added (``gpuflow.triggers.cancelling``);
- the local profile's pipeline processes: ``LocalProcessTrigger``.

Each cancels its job when a user kills the deferred task: the 3.3 triggerer calls ``on_kill``, and on 3.1 the
trigger calls it itself once Airflow says the task has left deferral (``gpuflow.triggers.kill``). A job that a dead
triggerer left running is stopped by the run's cleanup, which finds the run's jobs by name prefix.
Importing this package is cheap: the trigger modules are imported by ``job_trigger`` when a task defers. An operator
with ``deferrable=False`` waits for the same trigger in its worker (``event_in_worker``), as every task does for a
short while before it defers (``gpuflow.triggers.settle``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuflow.configuration.model import GpuflowConfig
    from gpuflow.platform import JobHandle


def job_trigger(config: GpuflowConfig, handle: JobHandle, until: str, timeout_s: float,
                poll_interval_s: float | None = None, cancel_on_kill: bool = True,
                carried: dict[str, Any] | None = None) -> Any:
    """The trigger that waits until the job of ``handle`` reaches ``until`` (running, done or stopped), polling every
    ``poll_interval_s`` (None: ``dataflow.poll_interval_s``; the local process's own half second), and stopping the
    job when its task is killed unless ``cancel_on_kill`` is False. Its event echoes ``carried``: what the task
    needs when it goes on."""
    poll_s = poll_interval_s if poll_interval_s is not None else config.dataflow.poll_interval_s
    if handle.kind == "local-process":
        from gpuflow.triggers.local import LocalProcessTrigger

        local_poll = {"poll_interval_s": poll_interval_s} if poll_interval_s is not None else {}
        return LocalProcessTrigger(pid=int(handle.id), log_path=handle.location, until=until, timeout_s=timeout_s,
                                   cancel_on_kill=cancel_on_kill, carried=carried, **local_poll)
    if handle.kind == "dataflow":
        from gpuflow.triggers.dataflow import DataflowJobStateTrigger

        return DataflowJobStateTrigger(project_id=config.project, location=handle.location, job_id=handle.id,
                                       until=until, timeout_s=timeout_s, **config.hook_identity(),
                                       poll_interval_s=poll_s, cancel_on_kill=cancel_on_kill, carried=carried)
    if handle.kind == "vertex-custom-job":
        from gpuflow.triggers.cancelling import CancellingCustomJobTrigger

        return CancellingCustomJobTrigger(project_id=config.project, location=handle.location,
                                          custom_job_id=handle.name.rsplit("/", 1)[-1],
                                          **config.hook_identity(), poll_interval=max(1, round(poll_s)),
                                          timeout_s=timeout_s, cancel_on_kill=cancel_on_kill, carried=carried)
    if handle.kind == "cloud-build":
        from gpuflow.triggers.cancelling import CancellingCloudBuildTrigger

        return CancellingCloudBuildTrigger(id_=handle.id, project_id=config.project, location=handle.location,
                                           **config.hook_identity(), poll_interval=poll_s, timeout_s=timeout_s,
                                           cancel_on_kill=cancel_on_kill, carried=carried)
    raise ValueError(f"no trigger waits on a job of kind {handle.kind}")


def first_event(trigger: Any, timeout_s: float) -> dict[str, Any]:
    """The trigger's first event, waited for in this process as the triggerer would wait for it (``run``: the
    event held for its settle time). Raises TimeoutError after ``timeout_s``."""
    return _first(trigger.run(), type(trigger).__name__, timeout_s)


def event_in_worker(trigger: Any, timeout_s: float) -> dict[str, Any]:
    """The trigger's first event, waited for by the task in its own worker (``events``: nothing to hold, since the
    task has not deferred, and nothing to cancel on a triggerer's behalf): for a task's short wait before it defers,
    and for an operator with ``deferrable=False``. Raises TimeoutError after ``timeout_s``; the job goes on. The event
    echoes what the task carried (the trigger's ``carried``), as ``run``'s does."""
    from gpuflow.triggers.settle import with_carried

    return with_carried(_first(trigger.events(), type(trigger).__name__, timeout_s), getattr(trigger, "carried", None))


def _first(events: Any, what: str, timeout_s: float) -> dict[str, Any]:
    import asyncio

    async def wait() -> dict[str, Any]:
        try:
            event = await asyncio.wait_for(anext(events), timeout_s)
        except StopAsyncIteration:
            raise RuntimeError(f"{what} ended without an event") from None
        finally:
            await events.aclose()
        return dict(event.payload)

    return asyncio.run(wait())
