"""What every part of the gcp profile shares: the configuration, the Google clients, GCS through the
provider's hook."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from gpuflow.configuration.model import GpuflowConfig
from gpuflow.platform.gcp_clients import GcpClients

if TYPE_CHECKING:
    from airflow.providers.google.cloud.hooks.gcs import GCSHook


class GcpService:
    def __init__(self, config: GpuflowConfig):
        self.config = config
        self.conn_id = config.gcp_conn_id
        self.clients = GcpClients(self.conn_id, config.impersonation_chain or None)

    def environment(self) -> contextlib.AbstractContextManager[Any]:
        # The provider's hooks read the Airflow connection; nothing has to be set in this process.
        return contextlib.nullcontext({})

    def _gcs(self) -> GCSHook:
        from airflow.providers.google.cloud.hooks.gcs import GCSHook

        return GCSHook(**self.config.hook_identity(self.conn_id))
