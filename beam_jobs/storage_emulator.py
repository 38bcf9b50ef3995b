"""The local profile's Cloud Storage through Beam's GCS filesystem, against gcp-storage-emulator (the local runner
only; Dataflow is untouched).

Beam 2.77's GcsIO first asks ``google.auth.default()`` for credentials, with four retries and exponential backoff
from 2 s (``_Credentials._get_credentials_with_retrys`` in ``apache_beam/internal/gcp/auth.py``), and only then
connects anonymously: about 23 s of every local job that reads or writes gs:// (a rollout evaluation's job, measured
here). The emulator needs no credentials, so Beam is told at once what it would conclude anyway: there are none.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def connect_anonymously() -> bool:
    """Beam's GCS client, anonymous from the start (its outcome when no credentials are found). False, with a
    warning, when Beam no longer keeps its credentials where this looks (then it only waits, as before)."""
    from apache_beam.internal.gcp import auth

    credentials = getattr(auth, "_Credentials", None)
    if credentials is None or not hasattr(credentials, "_credentials_init"):
        log.warning("gpuflow: Beam's credential cache moved (apache_beam.internal.gcp.auth); the storage emulator is "
                    "reached after Beam's credential retries")
        return False
    with credentials._credentials_lock:
        credentials._credentials, credentials._credentials_init = None, True
    return True
