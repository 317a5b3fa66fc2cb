"""Recorded traffic: `replay` it into a new samples topic, `export` samples, `stats`, `forget`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from claw_stream.cli.common import (
    METHODS,
    console,
    gateway_root,
    given,
    plugin_errors,
    progress_bars,
    run_async,
    settings_options,
    time_range,
)

if TYPE_CHECKING:
    from claw_stream.settings import Settings


@click.command()
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
    from rich.table import Table

    from claw_stream.worker.rederive import rederive

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
                rederive(
                    config=config,
                    topics=settings.topics,
                    kafka_bootstrap=settings.kafka_bootstrap,
                    database_url=settings.database_url,
                    source=source,
                    since=window.since,
                    until=window.until,
                    to_topic=to_topic,
                    progress=progress,
                    holdout_share=settings.eval.holdout_share,
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
        f"{report.withheld_sessions} sessions, {report.untrained_turns} turns, "
        f"{report.held_out_turns} held out",
    )
    console.print(table)
    console.print(f"train on it: claw-stream trainer --samples-topic {to_topic} [--init-from CKPT]")


@click.command()
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


@click.command()
@click.option("--limit", type=int, default=20, show_default=True, help="Rows of the long tables.")
@settings_options
def stats(settings: Settings, limit: int) -> None:
    """Print the consumer lag of each pipeline stage and the analytics views: reward per policy
    version, training curve, episodes."""
    from rich.table import Table

    from claw_stream.store.analytics import read_stats

    print_lag(settings)
    for title, rows in run_async(read_stats(settings.database_url, limit)).items():
        table = Table(*(rows[0].keys() if rows else ["(none yet)"]), title=title)
        for row in rows:
            table.add_row(*(_cell(v) for v in row.values()))
        console.print(table)


def print_lag(settings: Settings) -> None:
    """The lag table, or one line saying why the broker could not be read."""
    import asyncio

    from rich.table import Table

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
    from decimal import Decimal

    if value is None:
        return "-"
    if isinstance(value, float | Decimal):
        return f"{float(value):.3f}"
    return str(value)


@click.command()
@click.option("--session", "session_id", default=None, help="Forget this session.")
@click.option("--key", "api_key", default=None, help="Forget every session of this key.")
@click.option("--before", default=None, help="Forget sessions last seen before: ISO or 30d.")
@click.option(
    "--tenant", default=None, help="Forget every session of a tenant, and its adapter's versions."
)
@click.option("--base-url", default=None, help="Gateway root URL (default: from the settings).")
@settings_options
def forget(
    settings: Settings,
    session_id: str | None,
    api_key: str | None,
    before: str | None,
    tenant: str | None,
    base_url: str | None,
) -> None:
    """Delete sessions from every table and keep them out of training and replay for good."""
    import httpx
    from rich.table import Table

    if sum(v is not None for v in (session_id, api_key, before, tenant)) != 1:
        raise click.UsageError("name exactly one of --session, --key, --before, --tenant")
    body: dict[str, str | None] = {
        "session_id": session_id,
        "api_key": api_key,
        "tenant": tenant,
    }
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


COMMANDS: list[click.Command] = [replay, export, stats, forget]
