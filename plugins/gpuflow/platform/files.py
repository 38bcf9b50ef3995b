"""Files of a batch run, on GCS (the provider's GCSHook; the emulator on the local profile) or, on the local
profile, on local disk: find the input, count lines, and publish a staged folder in place of the final one."""

from __future__ import annotations

import contextlib
import glob
import logging
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from gpuflow.gcs_uris import is_gcs, split_gcs_uri
from gpuflow.runs.batch_paths import is_gpuflow_output

if TYPE_CHECKING:
    from airflow.providers.google.cloud.hooks.gcs import GCSHook

log = logging.getLogger(__name__)

_CHUNK = 1 << 20


def count_lines_in(chunks: Iterable[bytes]) -> int:
    """Lines as Beam's text source reads them: each ``\\n`` ends one, and a last line without one still counts."""
    lines, last = 0, b""
    for chunk in chunks:
        if chunk:
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    return lines + (1 if last and last != b"\n" else 0)


def _read_chunks(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            yield chunk


class BatchFiles:
    """Both kinds of path behind one interface, so the steps are written once."""

    def __init__(self, gcp_conn_id: str, impersonation_chain: list[str] | None = None):
        self.gcp_conn_id, self.impersonation_chain = gcp_conn_id, impersonation_chain

    @cached_property
    def gcs(self) -> GCSHook:
        from airflow.providers.google.cloud.hooks.gcs import GCSHook

        return GCSHook(gcp_conn_id=self.gcp_conn_id, impersonation_chain=self.impersonation_chain)

    def matching(self, pattern: str) -> list[str]:
        """The files a glob matches (GCS: its objects.list matchGlob, ``*`` within one folder)."""
        if is_gcs(pattern):
            bucket, name_glob = split_gcs_uri(pattern)
            return [f"gs://{bucket}/{name}" for name in sorted(self.gcs.list(bucket, match_glob=name_glob))
                    if not name.endswith("/")]
        return sorted(path for path in glob.glob(pattern) if Path(path).is_file())

    def in_folder(self, folder: str) -> list[str]:
        """Every file under ``folder`` (ending in /)."""
        if is_gcs(folder):
            bucket, prefix = split_gcs_uri(folder)
            return [f"gs://{bucket}/{name}" for name in sorted(self.gcs.list(bucket, prefix=prefix))]
        root = Path(folder)
        return sorted(str(path) for path in root.rglob("*") if path.is_file()) if root.is_dir() else []

    def count_lines(self, path: str) -> int:
        if not is_gcs(path):
            return count_lines_in(_read_chunks(Path(path)))
        with tempfile.TemporaryDirectory(prefix="gpuflow-count-") as scratch:
            local = Path(scratch) / "object"
            self.gcs.download(*split_gcs_uri(path), filename=str(local))  # to disk: an input may be larger than memory
            return count_lines_in(_read_chunks(local))

    def read_text(self, path: str) -> str:
        if is_gcs(path):
            return bytes(self.gcs.download(*split_gcs_uri(path))).decode("utf-8")
        return Path(path).read_text()

    def read_text_if_there(self, path: str) -> str | None:
        """The file's text; None when it is not there."""
        from google.api_core.exceptions import NotFound

        try:
            return self.read_text(path)
        except (NotFound, FileNotFoundError):
            return None

    def write_text(self, path: str, text: str) -> None:
        if is_gcs(path):
            bucket, name = split_gcs_uri(path)
            self.gcs.upload(bucket, name, data=text, mime_type="application/json")
        else:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text)

    def delete(self, path: str) -> None:
        if is_gcs(path):
            from google.api_core.exceptions import NotFound

            with contextlib.suppress(NotFound):  # already gone
                self.gcs.delete(*split_gcs_uri(path))
        else:
            Path(path).unlink(missing_ok=True)

    def delete_folder(self, folder: str) -> int:
        """Delete everything under ``folder``; the number of files deleted."""
        files = self.in_folder(folder)
        if is_gcs(folder):
            for path in files:
                self.delete(path)
        else:
            shutil.rmtree(folder, ignore_errors=True)
        return len(files)

    def delete_outputs(self, folder: str) -> int:
        """Delete the files gpuflow writes directly in ``folder`` (``gpuflow.runs.batch_paths.is_gpuflow_output``) and
        nothing else: the folder a run names may hold a team's own files, and a run deletes only what it makes."""
        own = [path for path in self.in_folder(folder)
               if "/" not in path[len(folder):] and is_gpuflow_output(path[len(folder):])]
        for path in own:
            self.delete(path)
        return len(own)

    def replace_folder(self, staged: str, final: str, names: list[str]) -> list[str]:
        """Make ``final`` hold the ``names`` of ``staged`` as gpuflow's only outputs there: gpuflow's files of an
        earlier run go first (a rerun's older answers), then each staged file is moved in (a copy within the
        bucket, or a rename). Files gpuflow did not write stay."""
        removed = self.delete_outputs(final)
        if removed:
            log.info("removed %d file(s) of an earlier run from %s", removed, final)
        published = []
        for name in names:
            source, target = staged + name, final + name
            if is_gcs(final):
                (source_bucket, source_name), (target_bucket, target_name) = split_gcs_uri(source), split_gcs_uri(target)
                self.gcs.copy(source_bucket, source_name, target_bucket, target_name)
            else:
                Path(final).mkdir(parents=True, exist_ok=True)
                Path(source).replace(target)
            published.append(target)
        return published
