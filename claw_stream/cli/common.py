"""What the command modules share: the settings flags, the console, error translation.

Imported by `claw-stream --help`, so it imports click alone: settings, pydantic, rich and
asyncio load inside the helpers, when a command runs.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import click

if TYPE_CHECKING:
    from rich.console import Console

    from claw_stream.settings import Settings

# claw_stream.names.METHODS, without importing pydantic (a unit test checks they agree)
METHODS: tuple[str, ...] = ("binary", "opd", "combine")

F = TypeVar("F", bound=Callable[..., Any])


@functools.cache
def rich_console() -> Console:
    """The one stdout console, made when first used."""
    from rich.console import Console

    return Console()


class _LazyConsole:
    """Stands for `rich_console()`: `console.print(...)` without importing rich at start."""

    def __getattr__(self, name: str) -> Any:
        return getattr(rich_console(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(rich_console(), name, value)


console = cast("Console", _LazyConsole())


def settings_options(fn: F) -> F:
    """--config and the most used settings as flags; each overrides env and file."""

    @click.option(
        "--config", type=click.Path(dir_okay=False, path_type=Path), help="YAML settings file."
    )
    @click.option(
        "--data-dir", type=click.Path(file_okay=False, path_type=Path), help="[CLAW_DATA_DIR]"
    )
    @click.option(
        "--kafka-bootstrap",
        "--kafka",
        "kafka_bootstrap",
        help="host:port of the Kafka broker [CLAW_KAFKA_BOOTSTRAP]",
    )
    @click.option("--database-url", help="SQLAlchemy async URL [CLAW_DATABASE_URL]")
    @functools.wraps(fn)
    def wrapper(
        *args: Any,
        config: Path | None,
        data_dir: Path | None,
        kafka_bootstrap: str | None,
        database_url: str | None,
        **kwargs: Any,
    ) -> Any:
        from claw_stream.settings import ConfigError, load_settings

        overrides = {
            "data_dir": data_dir,
            "kafka_bootstrap": kafka_bootstrap,
            "database_url": database_url,
            **kwargs.pop("setting_overrides", {}),
        }
        try:
            settings = load_settings(config, **overrides)
        except ConfigError as exc:
            raise click.ClickException(str(exc)) from None
        return fn(*args, settings=settings, **kwargs)

    return wrapper  # type: ignore[return-value]


def local_model(settings: Settings, name: str) -> Path:
    """A model folder on disk: a registered or hub model is pulled first (once, with progress)."""
    from rich.console import Console

    from claw_stream.embedded.downloads import ModelError
    from claw_stream.embedded.models import ensure_model

    try:
        return ensure_model(name, settings.models_dir, Console(stderr=True))
    except ModelError as exc:
        raise click.ClickException(str(exc)) from None


def progress_bars() -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    return Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=rich_console(),
    )


def given(**values: Any) -> dict[str, Any]:
    """The options the user set (click leaves the others None)."""
    return {k: v for k, v in values.items() if v is not None}


def gateway_root(settings: Settings, base_url: str | None) -> str:
    """The gateway's root URL: `--base-url` (with or without /v1), else the settings' own."""
    g = settings.gateway
    return (base_url or f"http://{g.host}:{g.port}").rstrip("/").removesuffix("/v1")


def run_async(coro: Any) -> Any:
    """Run a one-shot coroutine; connection problems become a readable one-line error."""
    import asyncio
    import logging

    from aiokafka.errors import KafkaError
    from sqlalchemy.exc import SQLAlchemyError

    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # the error below says it once
    try:
        return asyncio.run(coro)
    except (TimeoutError, ConnectionError, OSError, KafkaError, SQLAlchemyError) as exc:
        message = str(exc)
        if not message.startswith(type(exc).__name__):
            message = f"{type(exc).__name__}: {message}"
        raise click.ClickException(message) from None


@contextlib.contextmanager
def plugin_errors() -> Iterator[None]:
    """A plugin or prompt file that cannot be loaded: its message, not a traceback."""
    from claw_stream.plugins import PluginError
    from claw_stream.worker.prompt_files import PromptError

    try:
        yield
    except (PluginError, PromptError) as exc:
        raise click.ClickException(str(exc)) from None


def time_range(since: str, until: str | None) -> Any:
    """`--since` / `--until` of the commands that read recorded traffic."""
    from claw_stream.timerange import TimeRange

    try:
        return TimeRange.parse(since, until)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def show_report(settings: Settings, scope: Any = None, out: Path | None = None) -> None:
    """Print the learning report and write its PNG and HTML (`scope`: a report `Scope`)."""
    from claw_stream.evaluation.report import render
    from claw_stream.evaluation.report.learning import build
    from claw_stream.evaluation.report.reading import Scope, read

    learned = build(run_async(read(settings.database_url, settings.policy_name, scope or Scope())))
    for table in render.tables(learned):
        console.print(table)
    for line in [*render.verdicts(learned), render.waits_line(learned), *learned.notes]:
        console.print(line)
    png, html = render.write(learned, out or settings.data_dir / "reports")
    console.print(f"report: {html} (plot: {png})")


def closing_report(
    settings: Settings, held_out: Sequence[Any] = (), tenant: str | None = None
) -> None:
    """The learning report that ends a demo or a task run, after its held-out scores (the
    `ItemScore`s it made) are saved (a tenant's: under its name, as its adapter's versions);
    where the stack's Postgres is not reachable from here (a gateway elsewhere), one line says
    so instead."""
    from claw_stream.evaluation.held_out_records import save_item_scores
    from claw_stream.evaluation.report.reading import Scope

    try:
        if held_out:
            policy = tenant or settings.policy_name
            run_async(save_item_scores(settings.database_url, policy, held_out))
        show_report(settings, Scope(tenant=tenant))
    except click.ClickException as exc:
        rich_console().print(f"no learning report: {exc.message}", soft_wrap=True)
