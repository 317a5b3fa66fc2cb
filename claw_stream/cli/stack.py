"""The stack on one machine: `up`, the embedded `broker` and `postgres`, `db` migrations."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from claw_stream.cli.common import console, rich_console, run_async, settings_options

if TYPE_CHECKING:
    from claw_stream.settings import Settings


@click.command()
@click.option(
    "--broker/--no-broker", "embedded_broker", default=True, help="Run the embedded broker."
)
@click.option(
    "--postgres/--no-postgres", "embedded_postgres", default=True, help="Run the embedded Postgres."
)
@click.option("--engine/--no-engine", "with_engine", default=True, help="Run the built-in engine.")
@click.option("--gateway/--no-gateway", "with_gateway", default=True, help="Run the gateway.")
@click.option("--trainer/--no-trainer", "with_trainer", default=True, help="Run the trainer.")
@click.option("--worker/--no-worker", "with_worker", default=True, help="Run stream workers.")
@click.option(
    "--workers",
    type=click.IntRange(1, 64),
    default=None,
    help="Stream-worker processes sharing the partitions of one consumer group; more than "
    "claw.steps has partitions sit idle (default 1).",
)
@click.option(
    "--gateways",
    type=click.IntRange(1, 64),
    default=None,
    help="Gateway processes behind its one address [CLAW_GATEWAY__WORKERS] (default 1).",
)
@click.option(
    "--model",
    "model_name",
    default=None,
    help="Registered name, HF folder, or hub id such as Qwen/Qwen3-1.7B [CLAW_MODEL].",
)
@settings_options
def up(
    settings: Settings,
    embedded_broker: bool,
    embedded_postgres: bool,
    with_engine: bool,
    with_gateway: bool,
    with_trainer: bool,
    with_worker: bool,
    workers: int | None,
    gateways: int | None,
    model_name: str | None,
) -> None:
    """Start the whole stack on this machine and supervise it until Ctrl-C."""
    import asyncio
    import sys

    from claw_stream.embedded.supervisor import Supervisor

    if workers is not None and not with_worker:
        raise click.UsageError("--workers needs the worker (not --no-worker)")
    if gateways is not None and not with_gateway:
        raise click.UsageError("--gateways needs the gateway (not --no-gateway)")
    if model_name:
        settings.model = model_name
    if gateways is not None:
        settings.gateway = settings.gateway.model_copy(update={"workers": gateways})
    supervisor = Supervisor(settings, rich_console())
    supervisor.plan(
        embedded_broker=embedded_broker,
        embedded_postgres=embedded_postgres,
        engine=with_engine,
        gateway=with_gateway,
        trainer=with_trainer,
        worker=with_worker,
        workers=workers or 1,
    )
    sys.exit(asyncio.run(supervisor.run()))


@click.command()
@click.option("--host", default=None, help="Listen address (default 127.0.0.1).")
@click.option("--port", type=int, default=None, help="Listen port (default 9092).")
@settings_options
def broker(settings: Settings, host: str | None, port: int | None) -> None:
    """Run the embedded Kafka-compatible broker (Tansu, memory storage) in the foreground."""
    import os

    from claw_stream.embedded.broker import broker_command

    argv = broker_command(host or settings.broker_host, port or settings.broker_port)
    console.print(f"broker on {argv[3]} (memory storage: topics vanish when it stops)")
    os.execv(argv[0], argv)


@click.command()
@click.option("--host", default=None, help="Listen address (default 127.0.0.1).")
@click.option("--port", type=int, default=None, help="Listen port (default 5433).")
@settings_options
def postgres(settings: Settings, host: str | None, port: int | None) -> None:
    """Run the embedded PostgreSQL (data in $CLAW_DATA_DIR/postgres) in the foreground."""
    import asyncio
    import signal
    import subprocess
    import sys

    from claw_stream.embedded.postgres import EmbeddedPostgres

    pg = EmbeddedPostgres(
        settings.postgres_dir,
        host or settings.postgres_host,
        port or settings.postgres_port,
        settings.postgres_user,
        settings.postgres_db,
    )
    if pg.ensure_initialised():
        console.print(f"initialised a new cluster in {pg.data_dir}")
    proc = subprocess.Popen(pg.command(), **pg.popen_kwargs())
    forward = lambda *_: proc.send_signal(signal.SIGINT)  # noqa: E731 - fast shutdown
    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)

    async def ready() -> None:
        await pg.wait_ready()
        await pg.ensure_database()

    try:
        asyncio.run(ready())
    except Exception as exc:
        proc.send_signal(signal.SIGINT)
        proc.wait()
        raise click.ClickException(f"PostgreSQL did not become ready: {exc}") from None
    console.print(f"[green]ready[/green] {pg.url}")
    sys.exit(proc.wait())


@click.group()
def db() -> None:
    """The Postgres store: migrations."""


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True)
@settings_options
def db_upgrade(settings: Settings, revision: str) -> None:
    """Apply migrations up to a revision."""
    from claw_stream.store import migrate

    run_async(migrate.upgrade(settings.database_url, revision))
    console.print(f"database at {run_async(migrate.current(settings.database_url))}")


@db.command("current")
@settings_options
def db_current(settings: Settings) -> None:
    """Print the database's migration revision and the code's head."""
    from claw_stream.store import migrate

    current = run_async(migrate.current(settings.database_url))
    head = migrate.head_revision()
    console.print(f"current: {current or '(empty)'}  head: {head}")


COMMANDS: list[click.Command] = [up, broker, postgres, db]
