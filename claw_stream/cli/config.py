"""What the settings amount to: the `plugins` they load, the effective `settings`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from claw_stream.cli.common import console, settings_options

if TYPE_CHECKING:
    from claw_stream.settings import Settings
    from claw_stream.worker.config import WorkerSettings


@click.command()
@click.option("--check", is_flag=True, help="Exit 1 when a plugin the settings use fails to load.")
@settings_options
def plugins(settings: Settings, check: bool) -> None:
    """List the reward sources and losses installed, and which the settings use (each loaded,
    as the worker and the trainer will at start)."""
    import sys

    from rich.markup import escape
    from rich.table import Table

    from claw_stream.plugins import GROUPS, LOSSES_GROUP, PluginError, installed, load_loss_function
    from claw_stream.worker.config import BUILTIN_SOURCES
    from claw_stream.worker.prompt_files import PromptError, load_prompts
    from claw_stream.worker.reward_sources import load_sources

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

    def loads(config: WorkerSettings) -> Callable[[], object]:
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
        row("trainer.loss", loss, lambda: load_loss_function(loss, f"trainer.loss ({loss})"))
    console.print("used by these settings")
    console.print(used)
    if check and failed:
        sys.exit(1)


@click.command("settings")
@settings_options
def show_settings(settings: Settings) -> None:
    """Print the effective settings (file < environment < flags)."""
    for key, value in settings.model_dump(mode="json").items():
        shown = "(generated in data dir)" if key == "admin_key" and value is None else value
        console.print(f"{key} = {shown}")


COMMANDS: list[click.Command] = [plugins, show_settings]
