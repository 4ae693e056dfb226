"""Local PostgreSQL for the Feast SQL registry when `platform.postgres.enabled` (or `--postgres`) asks for it.

Trust authentication on 127.0.0.1 only: this cluster is for one developer's machine, never a shared host.
PostgreSQL refuses to run as root, so as root every server command runs as the `postgres` system user.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import subprocess
from pathlib import Path

from featurectl.services.process import HOST, LocalService, LocalServiceError, log_tail

SUPERUSER = "postgres"
SYSTEM_USER = "postgres"


def server_bin_dir() -> Path:
    """The folder holding initdb and pg_ctl: on PATH, else Debian's newest /usr/lib/postgresql/N/bin."""
    on_path = shutil.which("pg_ctl")
    if on_path and shutil.which("initdb"):
        return Path(on_path).parent
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"),
                        key=lambda p: [int(n) for n in re.findall(r"\d+", p.parent.parent.name)] or [0])
    if not candidates:
        raise LocalServiceError("PostgreSQL server programs (initdb, pg_ctl) not found on PATH nor in "
                                "/usr/lib/postgresql/*/bin: run scripts/setup.sh")
    return candidates[-1].parent


class PostgresServer(LocalService):
    name = "postgres"
    ready_timeout_s = 30.0
    stop_signal = signal.SIGINT  # "fast" shutdown: SIGTERM ("smart") would wait for every client to leave

    @property
    def data_dir(self) -> Path:
        return self.dir / "data"

    @property
    def socket_dir(self) -> Path:
        return self.dir / "run"

    @property
    def pid_file(self) -> Path:
        return self.data_dir / "postmaster.pid"

    @property
    def marker(self) -> str:
        return str(self.data_dir)

    @property
    def ports(self) -> list[int]:
        return [self.cfg.platform.postgres.port]

    def check_installed(self) -> None:
        server_bin_dir()
        if os.geteuid() == 0:
            try:
                pwd.getpwnam(SYSTEM_USER)
            except KeyError:
                raise LocalServiceError(f"running as root, PostgreSQL must run as the `{SYSTEM_USER}` system user, "
                                        "which does not exist: run scripts/setup.sh (it installs postgresql)") from None

    def run_as_owner(self, argv: list[str], what: str) -> None:
        """Run a server command as the data folder's owner; fail with its output."""
        if os.geteuid() == 0:
            argv = ["runuser", "-u", SYSTEM_USER, "--", *argv]
        done = subprocess.run(argv, capture_output=True, text=True, start_new_session=True)
        if done.returncode != 0:
            raise LocalServiceError(f"{what} failed (exit {done.returncode}):\n{done.stdout}{done.stderr}\n"
                                    f"last lines of {self.log_file}:\n{log_tail(self.log_file)}")

    def prepare_dirs(self) -> None:
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            owner = pwd.getpwnam(SYSTEM_USER)
            for folder in (self.dir, self.socket_dir):
                os.chown(folder, owner.pw_uid, owner.pw_gid)

    def start(self) -> None:
        self.prepare_dirs()
        bin_dir = server_bin_dir()
        if not (self.data_dir / "PG_VERSION").exists():
            self.run_as_owner([str(bin_dir / "initdb"), "-D", str(self.data_dir), "-U", SUPERUSER,
                               "--auth=trust", "-E", "UTF8", "--no-locale"], f"initdb of {self.data_dir}")
        options = (f"-p {self.ports[0]} -c listen_addresses={HOST} "
                   f"-c unix_socket_directories='{self.socket_dir}'")
        self.run_as_owner([str(bin_dir / "pg_ctl"), "-D", str(self.data_dir), "-l", str(self.log_file),
                           "-o", options, "-w", "-t", str(int(self.ready_timeout_s)), "start"],
                          f"pg_ctl start on {self.address}")

    def connect(self, dbname: str = "postgres"):
        import psycopg

        return psycopg.connect(host=HOST, port=self.ports[0], user=SUPERUSER, dbname=dbname,
                               connect_timeout=2, autocommit=True)

    def ready(self) -> bool:
        import psycopg

        try:
            with self.connect() as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.OperationalError:
            return False

    def after_ready(self) -> None:
        """Create the role and database that feature_store.yaml names, when missing."""
        from psycopg import sql

        pg = self.cfg.platform.postgres
        with self.connect() as conn:
            if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (pg.user,)).fetchone() is None:
                conn.execute(sql.SQL("CREATE ROLE {} LOGIN CREATEDB").format(sql.Identifier(pg.user)))
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (pg.database,)).fetchone() is None:
                conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(
                    sql.Identifier(pg.database), sql.Identifier(pg.user)))
