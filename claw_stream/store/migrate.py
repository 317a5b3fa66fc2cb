"""`claw-stream db upgrade|current`: Alembic driven from the settings, without alembic.ini."""

from __future__ import annotations

from collections.abc import Callable

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection

from claw_stream.resources import migrations_dir
from claw_stream.store.db import make_engine


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config("postgresql+asyncpg://")).get_current_head()


async def upgrade(database_url: str, revision: str = "head") -> None:
    config = alembic_config(database_url)
    engine = make_engine(database_url)
    try:
        async with engine.begin() as connection:
            await connection.run_sync(_with_connection(config, command.upgrade, revision))
    finally:
        await engine.dispose()


async def current(database_url: str) -> str | None:
    engine = make_engine(database_url)
    try:
        async with engine.connect() as connection:
            return await connection.run_sync(
                lambda sync: MigrationContext.configure(sync).get_current_revision()
            )
    finally:
        await engine.dispose()


def _with_connection(
    config: Config, fn: Callable[..., None], *args: str
) -> Callable[[Connection], None]:
    def run(sync_connection: Connection) -> None:
        config.attributes["connection"] = sync_connection
        fn(config, *args)

    return run
