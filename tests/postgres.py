"""A PostgreSQL server for the tests that start Airflow's own services, as Composer runs them: Composer's Airflow
database is a Cloud SQL instance, PostgreSQL (Composer 3's environment architecture), and Airflow's docs call SQLite
a development-only backend.

One server per test session, started by the session itself from Debian's ``postgresql`` package (``make test``
installs it where it is missing), on loopback only. PostgreSQL refuses to run as root, and CI runs as root, so the
server runs as the ``postgres`` system user, with a data folder that user owns outside pytest's 0700 temporary
folders. Each Airflow home gets a database of its own (``database_url``). Where the server cannot start, the session
fails at once with the fix; it never falls back to SQLite.
"""

from __future__ import annotations

import glob
import json
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

#: Where Debian puts PostgreSQL's server programs (postgresql-NN): not on PATH.
DEBIAN_BINDIRS = "/usr/lib/postgresql/*/bin"
#: The unprivileged user the server runs as when the tests run as root (Debian's postgresql package makes it).
SERVER_USER = "postgres"
#: Enough for two Airflow homes at once (each component's SQLAlchemy pool, the executor's and the triggerer's).
MAX_CONNECTIONS = 300
FIX = ("Fix: install Debian's PostgreSQL server (`apt-get install postgresql`; `make test` does it, through sudo "
       "when not root), or name its bin folder in GPUFLOW_TEST_POSTGRES_BINDIR")


class PostgresUnavailable(RuntimeError):
    """The test session's PostgreSQL could not start: the message names why and the fix."""


def server_bindir() -> Path:
    """The folder of initdb, pg_ctl and postgres: GPUFLOW_TEST_POSTGRES_BINDIR, else ``pg_config --bindir``, else the
    newest of Debian's /usr/lib/postgresql/NN/bin."""
    candidates: list[str] = []
    if named := os.environ.get("GPUFLOW_TEST_POSTGRES_BINDIR"):
        candidates.append(named)
    else:
        if shutil.which("pg_config"):
            answer = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True)
            if answer.returncode == 0:
                candidates.append(answer.stdout.strip())
        candidates += sorted(glob.glob(DEBIAN_BINDIRS), key=lambda path: int(Path(path).parent.name), reverse=True)
    for folder in candidates:
        if all(os.access(Path(folder) / program, os.X_OK) for program in ("initdb", "pg_ctl", "postgres")):
            return Path(folder)
    raise PostgresUnavailable(f"PostgreSQL's server programs (initdb, pg_ctl, postgres) are not in "
                              f"{candidates or [DEBIAN_BINDIRS]}. {FIX}.")


@dataclass
class PostgresServer:
    """A running server: ``port`` on 127.0.0.1, its data folder, the programs' folder."""

    port: int
    data_dir: str
    bindir: str
    user: str

    @classmethod
    def start(cls, port: int) -> PostgresServer:
        bindir = server_bindir()
        as_root = os.geteuid() == 0
        user = SERVER_USER if as_root else pwd.getpwuid(os.geteuid()).pw_name
        if as_root:
            try:
                owner = pwd.getpwnam(SERVER_USER)
            except KeyError:
                raise PostgresUnavailable(f"the tests run as root and PostgreSQL refuses to, but there is no "
                                          f"{SERVER_USER!r} user to run it as. {FIX}.") from None
        # Not under pytest's temporary folders: they are 0700 and root's, which the server's user cannot enter.
        data_dir = tempfile.mkdtemp(prefix="gpuflow-test-postgres-", dir="/tmp")
        if as_root:
            os.chown(data_dir, owner.pw_uid, owner.pw_gid)
        server = cls(port=port, data_dir=data_dir, bindir=str(bindir), user=user)
        try:
            server._run("initdb", "-D", data_dir, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C",
                        "--no-sync")
            # Loopback only; the socket in the data folder. No fsync: a test database need not survive a crash.
            options = (f"-c listen_addresses=127.0.0.1 -p {port} -k {data_dir} -c max_connections={MAX_CONNECTIONS} "
                       "-c fsync=off -c synchronous_commit=off -c full_page_writes=off")
            server._run("pg_ctl", "-D", data_dir, "-o", options, "-l", f"{data_dir}/server.log", "-w", "-t", "60",
                        "start")
        except PostgresUnavailable:
            server.stop()
            raise
        return server

    def _run(self, program: str, *args: str) -> None:
        as_root = os.geteuid() == 0
        answer = subprocess.run([str(Path(self.bindir) / program), *args], capture_output=True, text=True,
                                user=self.user if as_root else None, group=self.user if as_root else None,
                                extra_groups=[] if as_root else None, cwd="/tmp")
        if answer.returncode != 0:
            log = Path(self.data_dir) / "server.log"
            tail = log.read_text(errors="replace")[-2000:] if os.access(log, os.R_OK) else ""
            raise PostgresUnavailable(
                f"PostgreSQL's {program} failed (exit {answer.returncode}) for the test session's server on "
                f"127.0.0.1:{self.port}: {(answer.stderr or answer.stdout).strip()[-2000:]}\n{tail}\nFix: free port "
                f"{self.port} if another server holds it, or see the message above; {FIX}.")

    @property
    def admin_url(self) -> str:
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/postgres"

    def database_url(self, name: str) -> str:
        """A new, empty database ``name`` on this server (an Airflow home's own), as SQLAlchemy's URL."""
        import psycopg2

        connection = psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres")
        try:
            connection.autocommit = True  # (CREATE DATABASE runs outside a transaction)
            with connection.cursor() as cursor:
                cursor.execute(f'CREATE DATABASE "{name}"')
        finally:
            connection.close()
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{name}"

    def query(self, database: str, sql: str, *params: object) -> list[tuple]:
        import psycopg2

        connection = psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres", dbname=database)
        try:
            with connection.cursor() as cursor:
                cursor.execute(sql, params)
                return list(cursor.fetchall())
        finally:
            connection.close()

    def stop(self) -> None:
        """Stop the server at once (its databases are throwaway) and remove its data folder."""
        if (Path(self.data_dir) / "postmaster.pid").exists():
            subprocess.run([str(Path(self.bindir) / "pg_ctl"), "-D", self.data_dir, "-m", "immediate", "-w", "stop"],
                           capture_output=True, user=self.user if os.geteuid() == 0 else None, cwd="/tmp")
        shutil.rmtree(self.data_dir, ignore_errors=True)

    # -- one server for the whole session: the first process that needs it starts it, the session's end stops it --

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def load(cls, path: Path) -> PostgresServer | None:
        text = path.read_text() if path.exists() else ""
        return cls(**json.loads(text)) if text.strip() else None


def shared_server(state: Path, port: int) -> PostgresServer:
    """The session's server, started by the first test process that asks (a lock on ``state``, which records it
    or why it could not start); every other process, an xdist worker, reuses it or fails with the same reason."""
    import fcntl

    with open(state.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        failure = state.with_suffix(".failed")
        if failure.exists():
            raise PostgresUnavailable(failure.read_text())
        if server := PostgresServer.load(state):
            return server
        started = time.monotonic()
        try:
            server = PostgresServer.start(port)
        except PostgresUnavailable as problem:
            failure.write_text(str(problem))
            raise
        server.save(state)
        print(f"PostgreSQL {server.bindir} on 127.0.0.1:{port} in {time.monotonic() - started:.1f}s")
        return server


def stop_shared_server(state: Path) -> None:
    if server := PostgresServer.load(state):
        server.stop()
    for path in (state, state.with_suffix(".lock"), state.with_suffix(".failed")):
        path.unlink(missing_ok=True)
