"""PostgreSQL from the OS packages, with prepared transactions enabled and fsync on."""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import stat
from pathlib import Path
from typing import ClassVar

from eos_connectors.core.errors import StackError
from eos_connectors.dev.stack.process import LOOPBACK, free_port, pid_alive, run, wait_until
from eos_connectors.dev.stack.service import Service, ServiceRecord

# Server settings shared with docker-compose.yml (a test checks that they match).
POSTGRES_SETTINGS: dict[str, str] = {
    "max_prepared_transactions": "100",
    "max_connections": "200",
    "fsync": "on",
    "synchronous_commit": "on",
    # Logical decoding, for a Debezium connector reading the stack as a change source.
    "wal_level": "logical",
}

USER = "eos"
DATABASE = "eos"
INSTALL_HINT = (
    "Install the PostgreSQL server (Debian: 'apt-get install -y postgresql'), "
    "or run 'make bootstrap', which installs it."
)
# PostgreSQL refuses to run as root; a root-run stack runs it as this OS user.
SERVER_OS_USER = "postgres"


def find_bindir() -> Path:
    """The directory holding initdb/pg_ctl/postgres: the newest Debian install, else PATH."""
    debian = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    if debian:
        return debian[-1].parent
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).resolve().parent
    raise StackError(f"PostgreSQL's initdb was not found. {INSTALL_HINT}")


class PostgresService(Service):
    name = "postgres"
    stop_signal: ClassVar[int] = signal.SIGINT  # "fast" shutdown: don't wait for clients

    def __init__(self, root: Path, settings: dict[str, str] | None = None) -> None:
        super().__init__(root)
        self.settings = {**POSTGRES_SETTINGS, **(settings or {})}

    @property
    def data(self) -> Path:
        return self.dir / "data"

    @property
    def marker(self) -> Path:
        return self.data

    def check_installed(self) -> None:
        find_bindir()
        if os.geteuid() == 0:
            self._server_user()

    def start(self, previous: ServiceRecord | None) -> ServiceRecord:
        bindir = find_bindir()
        self._prepare_dir()
        password = self._init_cluster(bindir)
        port = free_port(previous.ports[0] if previous else None)
        self._write_config(port)
        self._remove_stale_lock()
        self._as_server_user(
            [
                str(bindir / "pg_ctl"),
                "-D",
                str(self.data),
                "-l",
                str(self.log_path),
                "-w",
                "-t",
                "60",
                "start",
            ],
            what=f"Starting PostgreSQL on port {port}",
        )
        pid = int((self.data / "postmaster.pid").read_text().split()[0])
        dsn = f"postgresql://{USER}:{password}@{LOOPBACK}:{port}/{DATABASE}"
        record = ServiceRecord(self.name, pid, (port,), dsn)
        wait_until(
            lambda: self.answers(record),
            timeout=60,
            what=f"PostgreSQL on port {port}",
            alive=lambda: pid_alive(pid),  # ours: just spawned (its title may be mid-rewrite)
            log_path=self.log_path,
        )
        return record

    def answers(self, record: ServiceRecord) -> bool:
        import psycopg

        try:
            with psycopg.connect(record.endpoint, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
        except psycopg.Error:
            return False
        return True

    # -- steps -----------------------------------------------------------------

    def _remove_stale_lock(self) -> None:
        """After a crash the lock files (data directory, socket) name a dead postmaster,
        or one still a zombie (PID 1 may reap late), which PostgreSQL takes for a
        running server."""
        for lock in [self.data / "postmaster.pid", *self.dir.glob("run/.s.PGSQL.*.lock")]:
            first = lock.read_text().split() if lock.exists() else []
            if first and first[0].isdigit() and not pid_alive(int(first[0])):
                lock.unlink()

    def _prepare_dir(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() != 0:
            return
        self._check_reachable_by_server_user()
        user = self._server_user()
        for path in [self.dir, *self.dir.rglob("*")]:
            os.chown(path, user.pw_uid, user.pw_gid, follow_symlinks=False)

    def _init_cluster(self, bindir: Path) -> str:
        password_file = self.dir / "password"
        if (self.data / "PG_VERSION").exists():
            return password_file.read_text().strip()
        password = secrets.token_hex(16)
        password_file.write_text(password + "\n")
        password_file.chmod(0o600)
        if os.geteuid() == 0:
            user = self._server_user()
            os.chown(password_file, user.pw_uid, user.pw_gid)
        self._as_server_user(
            [
                str(bindir / "initdb"),
                "-D",
                str(self.data),
                "-U",
                USER,
                f"--pwfile={password_file}",
                "--auth-host=scram-sha-256",
                "--auth-local=peer",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
            ],
            what="Initialising the PostgreSQL data directory",
        )
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write("\ninclude_if_exists = 'eos.conf'\n")
        self._initial_database(bindir)
        return password

    def _initial_database(self, bindir: Path) -> None:
        """Create the ``eos`` database in single-user mode, before the server listens."""
        single = [str(bindir / "postgres"), "--single", "-D", str(self.data), "postgres"]
        self._as_server_user(
            single, what="Creating the eos database", stdin=f"CREATE DATABASE {DATABASE};\n"
        )

    def _write_config(self, port: int) -> None:
        socket_dir = self.dir / "run"
        socket_dir.mkdir(exist_ok=True)
        if os.geteuid() == 0:
            user = self._server_user()
            os.chown(socket_dir, user.pw_uid, user.pw_gid)
        settings = {
            **self.settings,
            "listen_addresses": f"'{LOOPBACK}'",
            "port": str(port),
            "unix_socket_directories": f"'{socket_dir}'",
        }
        conf = self.data / "eos.conf"
        conf.write_text("".join(f"{k} = {v}\n" for k, v in settings.items()))

    def _as_server_user(self, argv: list[str], what: str, stdin: str | None = None) -> None:
        if os.geteuid() == 0:
            argv = ["runuser", "-u", SERVER_OS_USER, "--", *argv]
        run(argv, what=what, cwd=self.dir, stdin=stdin)

    def _server_user(self) -> pwd.struct_passwd:
        try:
            return pwd.getpwnam(SERVER_OS_USER)
        except KeyError as exc:
            raise StackError(
                f"PostgreSQL refuses to run as root, and there is no '{SERVER_OS_USER}' OS user "
                f"to run it as. {INSTALL_HINT} (the package creates that user)"
            ) from exc

    def _check_reachable_by_server_user(self) -> None:
        for parent in self.dir.resolve().parents:
            if not parent.stat().st_mode & stat.S_IXOTH:
                raise StackError(
                    f"PostgreSQL runs as OS user '{SERVER_OS_USER}' (it refuses root), which "
                    f"cannot reach {self.dir}: {parent} is not traversable by other users. "
                    "Set EOS_STACK_DIR to a directory below a world-traversable path "
                    "(root's default is /var/lib/eos-connectors/stack)."
                )
