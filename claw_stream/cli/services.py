"""The long-running services, one per command: `engine`, `gateway`, `trainer`, `worker`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from claw_stream.cli.common import (
    METHODS,
    console,
    given,
    local_model,
    plugin_errors,
    rich_console,
    settings_options,
)

if TYPE_CHECKING:
    from claw_stream.settings import Settings

KEEP_ALIVE_S = 75  # longer than the clients' own idle expiry (httpx, Node: 5 s; aiohttp: 15 s)


@click.command()
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
    from claw_stream.engine.openai.classify import (
        Classifier,
        create_classify_app,
        is_classifier,
    )
    from claw_stream.engine.server import EngineOptions, create_app

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
        max_loaded_adapters=cfg.max_loaded_adapters,
    )
    core.start()
    options = EngineOptions(
        served,
        settings.resolved_admin_key(),
        cfg.default_max_tokens,
        cfg.open_lora_routes,
        policy_name=settings.policy_name,
    )
    console.print(
        f"engine: {served} from {path} on http://{cfg.host}:{cfg.port}/v1 ({cfg.device}, {cfg.dtype})"
    )
    try:
        uvicorn.run(create_app(core, options), host=cfg.host, port=cfg.port, log_level="warning")
    finally:
        core.stop()


@click.command()
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
    import os
    import tempfile

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
        # an idle connection is the client's to close: uvicorn's 5 s default equals httpx's
        # and Node's own idle expiry, and a request sent on a connection the server was
        # closing at that moment failed with a read error (the demo's feedback POST after a
        # 6 s answer, seen on 2 loaded cores)
        "timeout_keep_alive": KEEP_ALIVE_S,
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


@click.command()
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
    import asyncio

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
    service = TrainerService(settings, path, rich_console())
    try:
        asyncio.run(service.run(max_steps))
    except KeyboardInterrupt:
        console.print("trainer stopped")


@click.command()
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
    import gc

    from claw_stream.worker.app import create_app

    update = given(judge_url=judge_url, method=method, app_id=app_id, metrics_port=metrics_port)
    settings.worker = settings.worker.model_copy(update=update)
    c = settings.worker
    named = f"{c.app_id} ({c.instance})" if c.instance else c.app_id
    console.print(
        f"worker {named}: {settings.topics.steps} + {settings.topics.session_events} -> "
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


@click.command("console")
@click.option("--host", default=None)
@click.option("--port", type=int, default=None)
@click.option("--gateway-url", default=None, help="The gateway whose routes its buttons call.")
@settings_options
def console_command(
    settings: Settings, host: str | None, port: int | None, gateway_url: str | None
) -> None:
    """The console alone (the gateway serves it at /console too): sessions, turns with their
    judgement, versions and lag in the browser, for the admin key."""
    import uvicorn

    from claw_stream.console.app import create_app

    update = given(host=host, port=port, gateway_url=gateway_url)
    settings.console = c = settings.console.model_copy(update=update)
    key = settings.resolved_admin_key()
    console.print(f"console: http://{c.host}:{c.port}/console/login?key={key}", soft_wrap=True)
    uvicorn.run(create_app(settings), host=c.host, port=c.port, log_level="warning")


COMMANDS: list[click.Command] = [engine, gateway, trainer, worker, console_command]
