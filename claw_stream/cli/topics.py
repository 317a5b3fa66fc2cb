"""`topics`: the specs in topics/*.yaml applied to a broker, their JSON Schemas generated."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from claw_stream.cli.common import console, run_async, settings_options

if TYPE_CHECKING:
    from claw_stream.settings import Settings


@click.group()
def topics() -> None:
    """Topic specs in topics/*.yaml: apply them to a broker, generate their JSON Schemas."""


@topics.command("apply")
@click.option("--check", is_flag=True, help="Exit 1 when any topic differs from its spec.")
@settings_options
def topics_apply(settings: Settings, check: bool) -> None:
    """Create missing topics and report drift; running it again changes nothing."""
    import sys

    from rich.table import Table

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


COMMANDS: list[click.Command] = [topics]
