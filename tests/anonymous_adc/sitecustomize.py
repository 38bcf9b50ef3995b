"""Application Default Credentials for the tests' Beam subprocesses: anonymous, at once.

Python imports this ``sitecustomize`` at start-up in the subprocesses of the gcp-profile tests, which put this
folder on PYTHONPATH (``tests.gcp_fakes.gcp_test_environment``). Beam's DataflowRunner, staging a job into the
GCS emulator, asks ``google.auth.default()`` for credentials; with none on this machine it retries with
exponential backoff for about 30 s, then connects anonymously. Here the answer is anonymous credentials at once,
which is what the emulator takes. Nothing outside the tests loads this file.
"""

import os

import google.auth
from google.auth.credentials import AnonymousCredentials


def _anonymous_default(*args, **kwargs):
    return AnonymousCredentials(), os.environ.get("GOOGLE_CLOUD_PROJECT")


google.auth.default = _anonymous_default
