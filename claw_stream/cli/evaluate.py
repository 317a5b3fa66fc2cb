"""Tasks and policy versions: `tasks run` (dataset-driven episodes), `eval` (score a served
version on held-out tasks), `report` (what each version learned), `rollback` (serve an older
version)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from claw_stream.cli.common import (
    closing_report,
    console,
    gateway_root,
    given,
    progress_bars,
    run_async,
    settings_options,
    show_report,
)

if TYPE_CHECKING:
    from claw_stream.settings import Settings


@click.group()
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
@click.option(
    "--signal-groups",
    type=click.IntRange(1),
    default=None,
    help="Dynamic sampling: draw tasks (round the set again, new seeds) until this many groups "
    "have rewards that differ; groups whose rewards are all equal teach nothing.",
)
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
    signal_groups: int | None,
    time_limit: float,
    model: str | None,
    base_url: str | None,
) -> None:
    """Play each task of DATASET (a JSONL file, or `arithmetic` / `files`) G times as one
    GRPO group, score each episode with the task's checker and end it with that reward."""
    import httpx
    from rich.table import Table

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
        signal_groups=signal_groups,
    )
    gateway = gateway_root(settings, base_url)
    with progress_bars() as bars:
        # dynamic sampling draws as many as it takes: no total known
        total = None if signal_groups else len(task_list) * group_size
        bar = bars.add_task("episodes", total=total)
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
    flat = report.flat_groups
    console.print(
        f"{len(report.groups())} groups, {len(flat)} with equal rewards "
        "(no signal: the trainer sets them aside)"
    )
    for episode in report.errors[:5]:
        console.print(f"[yellow]{episode.session_id}[/]: {episode.error}")
    if report.errors and len(report.errors) == len(report.episodes):
        raise click.ClickException(f"every episode failed ({len(report.errors)})")
    closing_report(settings)


@click.command("eval")
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
@click.option(
    "--replay",
    is_flag=True,
    help="Instead of tasks: ask the held-out turns of real conversations (eval.holdout_share, "
    "never trained) again of the served version, each new answer scored against the one the "
    "user got (replay_results, view replay_by_version).",
)
@click.option(
    "--judge-url",
    default=None,
    help="The replay's judge, with /v1 [eval.judge_url; default: the worker's judge].",
)
@click.option("--judge-model", default=None, help="The replay judge's model [eval.judge_model].")
@click.option(
    "--tenant",
    default=None,
    help="--replay: the tenant's held-out turns, asked again of its own adapter (default: the "
    "turns of everyone the shared policy serves).",
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
    replay: bool,
    judge_url: str | None,
    judge_model: str | None,
    tenant: str | None,
    base_url: str | None,
) -> None:
    """Score the served policy version on held-out tasks (side calls: never trained) and
    record the score per version in Postgres (eval_runs, view eval_scores); with --replay, on
    held-out turns of the users' own conversations."""
    import httpx

    from claw_stream.evaluation import service
    from claw_stream.tasks.dataset import DatasetError, load_tasks
    from claw_stream.tasks.runner import GatewayError
    from claw_stream.tasks.tools import ToolError

    update = given(
        dataset=dataset,
        agent=agent,
        limit=limit,
        attempts=attempts,
        judge_url=judge_url,
        judge_model=judge_model,
    )
    config = settings.eval = settings.eval.model_copy(update=update)
    if tenant is not None and not (replay and not follow):
        raise click.UsageError("--tenant goes with --replay (the held-out turns of a tenant)")
    if replay and not follow:
        replay_now(settings, base_url, tenant)
        return
    try:
        n_tasks = len(load_tasks(config.dataset, config.limit))
    except DatasetError as exc:
        raise click.ClickException(str(exc)) from None
    if follow:
        from prometheus_client import start_http_server

        from claw_stream.evaluation.records import EvalMetrics
        from claw_stream.versions.evaluate_each import evaluate_each

        metrics = EvalMetrics()
        if config.metrics_port is not None:
            start_http_server(config.metrics_port, config.metrics_host, registry=metrics.registry)
        what = "candidate" if settings.serving.policy == "gated" else "ready version"
        console.print(f"evaluating every {what} of {settings.policy_name} on {config.dataset}")
        try:
            run_async(
                evaluate_each(
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


def replay_now(settings: Settings, base_url: str | None, tenant: str | None = None) -> None:
    import httpx
    from openai import OpenAIError

    from claw_stream.evaluation.replay.service import replay
    from claw_stream.evaluation.service import gateway_url

    gateway = gateway_url(settings, base_url)
    with console.status(f"asking {settings.eval.replay_limit} held-out turns again"):
        try:
            done = run_async(replay(settings, settings.eval, gateway, tenant=tenant))
        except (httpx.HTTPError, OpenAIError) as exc:
            raise click.ClickException(f"{type(exc).__name__}: {exc}") from None
    print_replay(done, settings.eval.holdout_share)


def print_replay(done: Any, share: float) -> None:
    """A replay's outcome (a `ReplayRun`): a table per version and scorer, or why none."""
    from rich.table import Table

    if not done.held_out:
        console.print(
            f"no held-out turn yet: {share:.0%} of each user's main-line turns "
            "(eval.holdout_share) is held out as it is stitched; talk to the agent first"
        )
        return
    if not done.scores:
        console.print(
            f"{done.held_out} held-out turns asked again, {done.answered} answered, none "
            "scored: the judge's answers named neither A, B nor TIE"
        )
        return
    from claw_stream.evaluation.report.render import replay_cells, replay_header
    from claw_stream.evaluation.report.replayed import ReplayRow, replay_section

    rows = [
        ReplayRow(s.version, s.scorer, s.score, s.rule_score, s.judge_score, s.judge)
        for s in done.scores
    ]
    table = Table(
        *replay_header(), title="held-out turns answered again, against the answers the users got"
    )
    for line in replay_section(rows).lines:
        table.add_row(*replay_cells(line))
    console.print(table)


def print_scores(scores: list[Any]) -> None:
    from rich.table import Table

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


@click.command()
@click.option(
    "--to", "version", type=click.IntRange(0), required=True, help="The version to serve."
)
@click.option("--policy", default=None, help="Default: the settings' policy_name.")
@click.option("--tenant", default=None, help="A tenant's own adapter instead of the policy.")
@click.option(
    "--reason",
    default="by hand (claw-stream rollback)",
    show_default=True,
    help="Why: kept with the version, announced, and shown by `claw-stream report`.",
)
@settings_options
def rollback(
    settings: Settings, version: int, policy: str | None, tenant: str | None, reason: str
) -> None:
    """Serve an older version: its checkpoint goes to every serving engine (no request fails),
    a WeightEvent(ready, rolled_back_from) says so, and the trainer goes on from it. With
    --tenant, the tenant's adapter `tenant@vN` (its newer ones leave the engines)."""
    import httpx

    from claw_stream.versions import ServingError
    from claw_stream.versions.rollback import rollback as roll_back
    from claw_stream.versions.rollback import rollback_tenant

    if policy is not None and tenant is not None:
        raise click.UsageError("name --policy or --tenant, not both")
    if policy is not None:
        settings.policy_name = policy
    try:
        if tenant is not None:
            done = run_async(rollback_tenant(settings, tenant, version, reason))
        else:
            done = run_async(roll_back(settings, version, reason))
    except (ServingError, httpx.HTTPError) as exc:
        raise click.ClickException(str(exc)) from None
    console.print(
        f"{tenant or settings.policy_name}: serving v{done.version} (was v{done.previous}) "
        f"from {done.folder} on {', '.join(done.engines)}; WeightEvent ready published"
    )


@click.command()
@click.option(
    "--tenant",
    default=None,
    help="A tenant's own adapter: its versions, held-out scores and replays, and the live "
    "turns it answered (default: the shared policy's).",
)
@click.option("--key", default=None, help="Count the live turns and feedback of this key only.")
@click.option("--session", default=None, help="Count those of this session only.")
@click.option("--since", default=None, help="Since a time: ISO 8601 or a duration ago (2h, 7d).")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where report.png and report.html go (default: the data dir's reports/).",
)
@settings_options
def report(
    settings: Settings,
    tenant: str | None,
    key: str | None,
    session: str | None,
    since: str | None,
    out: Path | None,
) -> None:
    """What each version learned: its held-out win rate against the first version and the one
    before (95% intervals), the judge's votes on live turns, feedback and rewards, samples
    trained, minutes between versions, and how long feedback waited to be served. A table
    here, a PNG and a self-contained HTML page."""
    from claw_stream.evaluation.report.reading import Scope
    from claw_stream.timerange import parse_time

    try:
        scope = Scope(key, session, parse_time(since) if since else None, tenant)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from None
    show_report(settings, scope, out)


COMMANDS: list[click.Command] = [tasks, evaluate, report, rollback]
