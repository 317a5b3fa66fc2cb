"""`claw-stream skills`: the lessons the gateway adds to users' prompts, listed and steered."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from claw_stream.cli.common import console, run_async, settings_options

if TYPE_CHECKING:
    from claw_stream.settings import Settings


def _scope(tenant: str | None, key: str | None, everyone: bool, anonymous: bool) -> str | None:
    from claw_stream.skills.scope import ANONYMOUS, POLICY, user_scope
    from claw_stream.store.consent import hash_key

    if sum((tenant is not None, key is not None, everyone, anonymous)) > 1:
        raise click.UsageError("name at most one of --tenant, --key, --everyone, --anonymous")
    if tenant is not None:
        return user_scope(tenant, None)
    if key is not None:
        return user_scope(None, hash_key(key))
    if everyone:
        return POLICY
    return ANONYMOUS if anonymous else None


def _who(scope: str) -> str:
    return scope[:16] + "…" if scope.startswith("key:") else scope


def _id(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a skill id (a UUID)") from None


async def _with_db(settings: Settings, work: Any) -> Any:
    from claw_stream.store.db import make_engine

    engine = make_engine(settings.database_url)
    try:
        async with engine.begin() as conn:
            return await work(conn)
    finally:
        await engine.dispose()


def _whose(fn: Any) -> Any:
    for option in reversed(
        [
            click.option("--tenant", default=None, help="A tenant's skills."),
            click.option("--key", default=None, help="The skills of a user's session key."),
            click.option("--everyone", is_flag=True, help="The skills every user's calls carry."),
            click.option(
                "--anonymous", is_flag=True, help="The skills of calls with no tenant or key."
            ),
        ]
    ):
        fn = option(fn)
    return fn


@click.group()
def skills() -> None:
    """The lessons learned from users (their corrections, feedback, the judge's hints) that the
    gateway adds to their prompts."""


@skills.command("list")
@_whose
@click.option("--all", "everything", is_flag=True, help="Retired skills too.")
@click.option("--limit", type=int, default=200, show_default=True)
@settings_options
def list_skills(
    settings: Settings,
    tenant: str | None,
    key: str | None,
    everyone: bool,
    anonymous: bool,
    everything: bool,
    limit: int,
) -> None:
    """Skills, each user's together, most confirmed first."""
    from rich.table import Table

    from claw_stream.store import skills as store

    scope = _scope(tenant, key, everyone, anonymous)
    states = store.STATES if everything else ("active", "pinned")
    rows = run_async(_with_db(settings, lambda c: store.listing(c, scope, states, limit)))
    table = Table(title=f"{len(rows)} skills")
    table.add_column("id", no_wrap=True)
    for name in ("whose", "state", "taught", "from", "skill"):
        table.add_column(name)
    for skill in rows:
        table.add_row(
            str(skill.skill_id),
            _who(skill.scope),
            skill.state,
            str(skill.confirmations),
            skill.source,
            skill.text,
        )
    console.print(table)


@skills.command()
@click.argument("skill_id")
@settings_options
def show(settings: Settings, skill_id: str) -> None:
    """One skill and the turns that taught it."""
    from rich.table import Table

    from claw_stream.store import skills as store

    found = run_async(_with_db(settings, lambda c: store.one(c, _id(skill_id))))
    if found is None:
        raise click.ClickException(f"no skill {skill_id}")
    skill = found
    console.print(f"[bold]{skill.text}[/]")
    console.print(
        f"{_who(skill.scope)} · {skill.state} · taught {skill.confirmations} times · first from "
        f"{skill.source} · {skill.created_at:%Y-%m-%d %H:%M} · changed "
        f"{skill.updated_at:%Y-%m-%d %H:%M}"
    )
    if skill.teachers and skill.scope == "policy":
        console.print(f"taught by {len(skill.teachers)} users")
    table = Table("session", "step", "from", title="provenance (newest last)")
    for p in skill.provenance:
        table.add_row(p.get("session_id") or "-", p.get("step_id") or "-", p.get("source") or "-")
    console.print(table)


def _state_command(name: str, state: str, doc: str) -> click.Command:
    @click.command(name, help=doc)
    @click.argument("skill_ids", nargs=-1, required=True)
    @settings_options
    def change(settings: Settings, skill_ids: tuple[str, ...]) -> None:
        from claw_stream.store import skills as store

        ids = [_id(s) for s in skill_ids]

        async def work(conn: Any) -> list[bool]:
            return [await store.steer(conn, i, state=state) for i in ids]

        for skill_id, done in zip(skill_ids, run_async(_with_db(settings, work)), strict=True):
            if not done:
                raise click.ClickException(f"no skill {skill_id}")
            console.print(f"{skill_id}: {state}")

    return change


skills.add_command(
    _state_command("retire", "retired", "Stop adding these skills to prompts (kept, listed).")
)
skills.add_command(_state_command("pin", "pinned", "Always add these skills first."))
skills.add_command(
    _state_command("activate", "active", "Add these skills again (unpin, or bring back).")
)


@skills.command()
@click.argument("skill_id")
@click.argument("text")
@settings_options
def edit(settings: Settings, skill_id: str, text: str) -> None:
    """Reword a skill."""
    from claw_stream.store import skills as store

    try:
        done = run_async(_with_db(settings, lambda c: store.steer(c, _id(skill_id), text=text)))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if not done:
        raise click.ClickException(f"no skill {skill_id}")
    console.print(f"{skill_id}: edited")


@skills.command()
@click.argument("skill_ids", nargs=-1, required=True)
@settings_options
def delete(settings: Settings, skill_ids: tuple[str, ...]) -> None:
    """Delete skills for good."""
    from claw_stream.store import skills as store

    ids = [_id(s) for s in skill_ids]

    async def work(conn: Any) -> list[bool]:
        return [await store.remove(conn, i) for i in ids]

    for skill_id, done in zip(skill_ids, run_async(_with_db(settings, work)), strict=True):
        if not done:
            raise click.ClickException(f"no skill {skill_id}")
        console.print(f"{skill_id}: deleted")


@skills.command()
@click.argument("text")
@_whose
@click.option("--pin", is_flag=True, help="Added first, always.")
@settings_options
def add(
    settings: Settings,
    text: str,
    tenant: str | None,
    key: str | None,
    everyone: bool,
    anonymous: bool,
    pin: bool,
) -> None:
    """Write a skill yourself, for a user (--tenant, --key, --anonymous) or --everyone."""
    from claw_stream.store import skills as store

    scope = _scope(tenant, key, everyone, anonymous)
    if scope is None:
        raise click.UsageError("say whose skill it is: --tenant, --key, --anonymous or --everyone")
    state = "pinned" if pin else "active"
    try:
        skill_id = run_async(_with_db(settings, lambda c: store.add(c, scope, text, state)))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    console.print(str(skill_id))


@skills.command("export")
@click.option(
    "--out",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="JSONL file: one skill a line, with its provenance.",
)
@settings_options
def export_skills(settings: Settings, out: Path) -> None:
    """Write every skill (retired ones too) as JSONL."""
    import orjson

    from claw_stream.store import skills as store

    rows = run_async(_with_db(settings, lambda c: store.listing(c, None, store.STATES, None)))
    try:
        with out.open("wb") as f:
            for skill in rows:
                record = {c: getattr(skill, c) for c in store.EXPORTED}
                f.write(orjson.dumps(record, default=str) + b"\n")
    except OSError as exc:
        raise click.ClickException(f"cannot write --out {out}: {exc.strerror or exc}") from None
    console.print(f"{len(rows)} skills -> {out}")


COMMANDS: list[click.Command] = [skills]
