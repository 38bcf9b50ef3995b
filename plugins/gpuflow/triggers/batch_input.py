"""Where the batch's input sensor (``WaitForInputOperator``, the provider's ``GCSObjectExistenceSensor``) waits,
deferred, up to ``batch.input_wait_s``; then an event says whether any file matched (the sensor's ``soft_fail``
applies ``batch.missing_input``).

- gcp: the provider's ``GCSBlobTrigger`` with ``use_glob`` (objects.list's matchGlob). Provider gap
  (apache-airflow-providers-google 22.8.0): its constructor takes no timeout, and it waits without end, so gpuflow
  bounds it (``_TimeoutAndCancel``, with nothing to cancel) and ends with a ``timeout`` event.
- local profile: the emulator is not where the provider's async GCS client looks (it reads STORAGE_EMULATOR_HOST from
  the triggerer's environment), so this module's ``LocalInputTrigger`` lists the emulator, or the local disk, itself.
"""

from __future__ import annotations

import asyncio
import glob
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from airflow.providers.google.cloud.triggers.gcs import GCSBlobTrigger
from airflow.triggers.base import TriggerEvent

from gpuflow.triggers.cancelling import _TimeoutAndCancel
from gpuflow.triggers.settle import HOLD_S, SettlingTrigger


def _no_input_message(pattern: str, timeout_s: float) -> str:
    return f"no file matched {pattern} within {timeout_s:.0f}s"


class BoundedGcsBlobTrigger(_TimeoutAndCancel, GCSBlobTrigger):
    timeout_status = "timeout"

    @property
    def what(self) -> str:
        return f"gs://{self.bucket}/{self.object_name}"

    def timeout_message(self) -> str:
        return _no_input_message(self.what, self.timeout_s)

    async def cancel_job(self) -> None:
        """Nothing runs on the input's behalf: there is nothing to cancel."""


class LocalInputTrigger(SettlingTrigger):
    """The local profile: a glob on local disk, or a gs:// glob on the GCS emulator at ``emulator_url``."""

    def __init__(self, pattern: str, emulator_url: str, project: str, timeout_s: float, poll_interval_s: float,
                 settle_s: float = HOLD_S,
                 carried: dict[str, Any] | None = None, deferred_at: float | None = None):
        super().__init__(settle_s, carried, deferred_at)
        self.pattern, self.emulator_url, self.project = pattern, emulator_url, project
        self.timeout_s, self.poll_interval_s = timeout_s, poll_interval_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self._with_settle("gpuflow.triggers.batch_input.LocalInputTrigger", {
            "pattern": self.pattern, "emulator_url": self.emulator_url, "project": self.project,
            "timeout_s": self.timeout_s, "poll_interval_s": self.poll_interval_s})

    def _matching(self) -> list[str]:
        if not self.pattern.startswith("gs://"):
            return [path for path in glob.glob(self.pattern) if Path(path).is_file()]
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        bucket, _, name_glob = self.pattern.removeprefix("gs://").partition("/")
        client = storage.Client(project=self.project, credentials=AnonymousCredentials(),
                                client_options={"api_endpoint": self.emulator_url})
        return [blob.name for blob in client.list_blobs(bucket, match_glob=name_glob)]

    async def events(self) -> AsyncIterator[TriggerEvent]:
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                found = await asyncio.to_thread(self._matching)
            except Exception as error:  # the emulator is gone, a bucket is missing: the task says why
                yield TriggerEvent({"status": "error", "message": f"listing {self.pattern} failed: {error}"})
                return
            if found:
                yield TriggerEvent({"status": "success", "message": f"{len(found)} file(s) match {self.pattern}"})
                return
            if time.monotonic() >= deadline:
                yield TriggerEvent({"status": "timeout", "message": _no_input_message(self.pattern, self.timeout_s)})
                return
            await asyncio.sleep(min(self.poll_interval_s, max(0.0, deadline - time.monotonic())))


def input_trigger(config: Any) -> SettlingTrigger | BoundedGcsBlobTrigger:
    """The trigger that waits up to batch.input_wait_s for batch.input (a filled glob) to match a file."""
    batch = config.batch
    if config.traits.storage_emulator:
        return LocalInputTrigger(batch.input, config.local.storage_emulator_host, config.project,
                                 batch.input_wait_s, batch.input_poll_interval_s)
    bucket, _, name_glob = batch.input.removeprefix("gs://").partition("/")
    return BoundedGcsBlobTrigger(bucket=bucket, object_name=name_glob, use_glob=True,
                                 poke_interval=batch.input_poll_interval_s, google_cloud_conn_id=config.gcp_conn_id,
                                 hook_params={"impersonation_chain": config.impersonation_chain or None},
                                 timeout_s=batch.input_wait_s)
