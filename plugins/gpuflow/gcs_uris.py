"""gs:// URIs taken apart and compared. No third-party imports: a helper every layer shares."""

from __future__ import annotations


def is_gcs(path: str) -> bool:
    return path.startswith("gs://")


def split_gcs_uri(uri: str) -> tuple[str, str]:
    """``gs://bucket/a/b`` -> ``("bucket", "a/b")``."""
    bucket, _, name = uri.removeprefix("gs://").partition("/")
    return bucket, name


def under_prefix(path: str, prefix: str) -> bool:
    """``path`` lies in the folder ``prefix`` names, compared at a segment boundary: ``gs://b/answers`` is in
    ``gs://b/answers/`` and ``gs://b/answers``; ``gs://b/answers-evil/`` in neither."""
    folder = prefix if prefix.endswith("/") else prefix + "/"
    return path.startswith(folder) or path == folder.rstrip("/")
