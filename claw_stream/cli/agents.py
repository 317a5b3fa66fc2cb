"""An agent and the running stack: `connect` it to the gateway, `doctor` the stack as it
sees it, `demo` a scripted user through it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from claw_stream.agents.names import CONNECTABLE
from claw_stream.cli.common import (
    closing_report,
    console,
    gateway_root,
    progress_bars,
    run_async,
    settings_options,
)

if TYPE_CHECKING:
    from claw_stream.settings import Settings


@click.command()
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
    from rich.table import Table

    from claw_stream.agents import doctor as checks

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
            found.append(checks.check_agents_fit(context))
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
    import asyncio

    from rich.table import Table

    from claw_stream.agents.doctor import DOCTOR_GROUP
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
        "session",
        "main turns",
        "side calls",
        "judged",
        "sampled",
        "trained",
        "with skills",
        title="sessions",
    )
    for s in summarise(facts):
        summary.add_row(
            s.session_id,
            str(s.main),
            str(s.side),
            str(s.judged),
            str(s.sampled),
            str(s.trained),
            str(s.with_skills),
        )
    console.print(summary)
    turns = Table("session", "turn", "what became of it", title="turns")
    for f in facts:
        turns.add_row(f.session_id, str(f.turn_index), why(f))
    console.print(turns)


@click.command()
@click.argument("agent", type=click.Choice(CONNECTABLE))
@click.option("--base-url", default=None, help="Gateway root URL (default: from the settings).")
@click.option(
    "--key",
    default=None,
    help="The key the agent sends (default: the one already written in its file, where it "
    "keeps one there; else the client key, or for zeroclaw and aider a fresh session key).",
)
@click.option("--model", default=None, help="Model name (default: what the gateway serves).")
@click.option("--context", type=int, default=None, help="Its context window (with --model).")
@click.option(
    "--file",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The agent's config file (default: where the agent keeps it); a file it keeps "
    "beside it (Gemini CLI's .env) is in the same folder.",
)
@click.option(
    "--tenant",
    default=None,
    help="Whose agent it is: it calls with a key of this tenant (tenants.keys; for zeroclaw a "
    "fresh session key started for it), so its own adapter serves it where it has one.",
)
@click.option("--print", "print_only", is_flag=True, help="Show the change, write nothing.")
@click.option(
    "--undo",
    is_flag=True,
    help="Put the agent's config file back as it was before the first connect, byte for byte "
    "(removed if there was none).",
)
@settings_options
def connect(
    settings: Settings,
    agent: str,
    base_url: str | None,
    key: str | None,
    model: str | None,
    context: int | None,
    config_file: Path | None,
    tenant: str | None,
    print_only: bool,
    undo: bool,
) -> None:
    """Point a coding agent at the gateway: our provider merged into its own config file."""
    import httpx

    from claw_stream.agents import connect as agent_config
    from claw_stream.agents.target import AgentConfigFileError, Target

    chosen = agent_config.AGENTS[agent]
    if undo:
        _undo(agent_config, chosen, config_file, print_only)
        return
    url = gateway_root(settings, base_url)
    if tenant is not None and key is None and not chosen.session_key:
        # the agents that name their own sessions call with a key: the tenant's
        key = next((k for k, t in settings.tenants.keys.items() if t == tenant), None)
        if key is None:
            raise click.ClickException(
                f"no key of tenant {tenant} in the settings: add one under tenants.keys "
                f"({{KEY: {tenant}}}) and restart the gateway, or give --key"
            )
    try:  # a file that cannot be connected says so before a session is started for it
        if tenant is None:  # a key it has was not given for a tenant
            key = key or agent_config.stored_key(chosen, config_file)
    except AgentConfigFileError as exc:
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
        except (httpx.HTTPError, ValueError) as exc:
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
                json={"tenant": tenant} if tenant else {},
                timeout=30,
            )
            answer.raise_for_status()
            key, started = answer.json()["api_key"], answer.json()["session_id"]
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            raise click.ClickException(
                f"cannot start a session at {url} for {agent}'s key ({exc}); is `claw-stream "
                "up` running with this admin key? (or give --key)"
            ) from None
    target = Target(url, key or client_key, model, context)
    try:  # the agent's config file, and any it keeps beside it (Gemini CLI's .env)
        changes = agent_config.plans(chosen, target, config_file)
    except AgentConfigFileError as exc:
        raise click.ClickException(str(exc)) from None
    notes, changed = changes[0].notes, [c for c in changes if c.changed]
    if not changed:
        where = ", ".join(str(c.path) for c in changes)
        console.print(
            f"{agent} is already connected to {url} ({where}): nothing changed", soft_wrap=True
        )
        for note in notes:
            console.print(note, soft_wrap=True, markup=False, highlight=False)
        return
    for change in changed:
        console.print(change.diff(), markup=False, highlight=False, end="", soft_wrap=True)
    for note in notes:
        console.print(note, soft_wrap=True, markup=False, highlight=False)
    if print_only:
        where = ", ".join(str(c.path) for c in changed)
        console.print(f"(--print: {where} not written)", soft_wrap=True)
        return
    if started:
        console.print(f"its key is a fresh session key, of session {started}", soft_wrap=True)
    for change in changed:
        backup = agent_config.write(change)
        kept = f"; the file as it was: {backup}" if backup else ""
        console.print(f"wrote {change.path}{kept}", soft_wrap=True)
    console.print(f"{agent} now uses {model} at {url}: {chosen.then(target)}", soft_wrap=True)


def _undo(agent_config: Any, chosen: Any, config_file: Path | None, print_only: bool) -> None:
    """`connect --undo`: the agent's file as it was before the first connect."""
    from claw_stream.agents.target import AgentConfigFileError

    try:
        changes = agent_config.plan_undos(chosen, config_file)
    except AgentConfigFileError as exc:
        raise click.ClickException(str(exc)) from None
    for change in changes:
        console.print(change.diff(), markup=False, highlight=False, end="", soft_wrap=True)
    if print_only:
        where = ", ".join(str(c.path) for c in changes)
        console.print(f"(--print: {where} not written)", soft_wrap=True)
        return
    for change in changes:
        agent_config.undo(change)
        if change.was is None:
            console.print(f"removed {change.path}: there was none before connect", soft_wrap=True)
        else:
            console.print(f"put {change.path} back as it was before connect", soft_wrap=True)


@click.command()
@click.option("--episodes", type=int, default=20, show_default=True)
@click.option("--concurrency", type=int, default=4, show_default=True, help="Episodes at once.")
@click.option("--max-words", type=int, default=30, show_default=True, help="The persona's limit.")
@click.option(
    "--held-out/--no-held-out",
    default=True,
    show_default=True,
    help="Score every version served on the same held-out questions (side calls, never trained).",
)
@click.option(
    "--replay/--no-replay",
    default=True,
    show_default=True,
    help="At the end, ask the persona's held-out turns (eval.holdout_share) again of the last "
    "version: scored by the persona's rule, and by the judge beside it (their agreement).",
)
@click.option(
    "--wants",
    type=click.Choice(["short", "long"]),
    default="short",
    show_default=True,
    help="Thumbs up for answers under --max-words, or for --max-words or more.",
)
@click.option(
    "--brief",
    is_flag=True,
    help="Ask for answers in one or two sentences (SmolLM2's then fall either side of 30 "
    "words: room for either taste).",
)
@click.option(
    "--tenant",
    default=None,
    help="Play a tenant's user: its sessions are the tenant's, trained into its own adapter "
    "where tenants.adapters names it; the report is of that adapter.",
)
@click.option(
    "--learn",
    type=click.Choice(["weights", "skills", "both"]),
    default="both",
    show_default=True,
    help="What the persona teaches: the weights (its calls carry no skills), its skills (the "
    "lessons of its corrections, in its prompts the same minute; with `up --no-trainer`, "
    "nothing else), or both. With skills, the held-out set is asked again with them at the end.",
)
@click.option("--base-url", default=None, help="Gateway root URL (default: from the settings).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None)
@settings_options
def demo(
    settings: Settings,
    episodes: int,
    concurrency: int,
    max_words: int,
    held_out: bool,
    replay: bool,
    wants: str,
    brief: bool,
    tenant: str | None,
    learn: str,
    base_url: str | None,
    plot_path: Path | None,
) -> None:
    """Play a scripted user who wants short (or long) answers through the gateway; show what
    changed."""
    from claw_stream.demo.held_out import HELD_OUT_QUESTIONS
    from claw_stream.demo.persona import ASK_BRIEFLY, Persona
    from claw_stream.demo.report import plot, tables
    from claw_stream.demo.run import run_demo
    from claw_stream.tenants import check_tenant

    if tenant is not None:
        try:
            check_tenant(tenant, settings.policy_name)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--tenant") from None
    gateway = gateway_root(settings, base_url)
    persona = Persona(max_words, wants, ASK_BRIEFLY if brief else "")  # type: ignore[arg-type]
    seen: list[tuple[int, bool]] = []
    with progress_bars() as bars:
        task = bars.add_task("episodes", total=episodes)

        def update(answers: list[Any]) -> None:
            seen.extend((a.version, a.reward > 0) for a in answers)
            version = max(v for v, _ in seen)
            recent = [s for v, s in seen if v == version]
            bars.update(
                task,
                advance=1,
                description=f"episodes — {tenant or 'policy'} v{version}: {sum(recent)}/"
                f"{len(recent)} {wants}",
            )

        tally = run_async(
            run_demo(
                gateway,
                settings.resolved_admin_key(),
                episodes,
                concurrency=concurrency,
                persona=persona,
                on_answers=update,
                held_out=HELD_OUT_QUESTIONS if held_out else None,
                tenant=tenant,
                learn=learn,  # type: ignore[arg-type]
            )
        )
    for table in tables(tally, max_words, wants):
        console.print(table)
    if held_out:
        console.print(tally.verdict(f"{wants} answers"), soft_wrap=True)
        if learn != "weights" and tally.held_out_skills:
            console.print(tally.skills_verdict(f"{wants} answers"), soft_wrap=True)
        elif learn != "weights":
            console.print("skills are off on this stack (skills.enabled): weights only")
    path = plot(tally, plot_path or settings.data_dir / "demo.png", max_words)
    console.print(f"plot: {path}")
    if replay:
        replay_persona_turns(settings, gateway, persona, tenant)
    closing_report(settings, tally.item_scores(), tenant)


def replay_persona_turns(
    settings: Settings, gateway: str, persona: Any, tenant: str | None = None
) -> None:
    """The persona's held-out turns asked again of the version serving now, scored by its rule
    and by the judge: the report measures how often the judge agrees with the rule."""
    import httpx
    from openai import OpenAIError

    from claw_stream.cli.evaluate import print_replay
    from claw_stream.evaluation.replay.service import NamedRule, replay

    rule = NamedRule("persona", lambda request, answer: float(persona.likes(answer)))
    with console.status("asking the persona's held-out turns again (rule and judge)"):
        try:
            done = run_async(replay(settings, settings.eval, gateway, rule=rule, tenant=tenant))
        except (httpx.HTTPError, OpenAIError) as exc:
            console.print(f"no replay of held-out turns: {type(exc).__name__}: {exc}")
            return
        except click.ClickException as exc:  # Postgres not reachable from here
            console.print(f"no replay of held-out turns: {exc.message}")
            return
    print_replay(done, settings.eval.holdout_share)


COMMANDS: list[click.Command] = [connect, doctor, demo]
