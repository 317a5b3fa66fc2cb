"""The documentation site's reference pages say what the code does: each is generated from the
code (`python -m claw_stream.cli.reference`, run by `make docs`) and must equal what the code
generates now."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from claw_stream.cli import reference
from claw_stream.settings import Settings

from ..support.paths import REPO

PAGES = REPO / "docs" / "reference"


def test_every_reference_page_is_what_the_code_generates() -> None:
    assert reference.stale(PAGES) == [], "run `make docs` and commit docs/reference/"


@pytest.fixture
def changed_description() -> Iterator[str]:
    field = Settings.model_fields["policy_name"]
    was = field.description
    field.description = "a description the page does not hold yet"
    try:
        yield field.description
    finally:
        field.description = was


def test_a_changed_field_makes_the_settings_page_stale(
    tmp_path: Path, changed_description: str
) -> None:
    for name in ("settings.md", "cli.md"):
        (tmp_path / name).write_text((PAGES / name).read_text())
    assert "settings.md" in reference.stale(tmp_path)
    assert changed_description in reference.settings_page()


def test_the_settings_page_names_each_setting_by_file_and_environment() -> None:
    page = reference.settings_page()
    assert "| `gateway.port` | `CLAW_GATEWAY__PORT` | `int` |" in page
    assert "| `models_dir_override` | `CLAW_MODELS_DIR` |" in page
    assert '`"~/.claw-stream"`' in page  # the user's home, not this machine's
    for section in ("gateway", "worker", "trainer", "engine", "serving", "eval", "tenants"):
        assert f"\n## {section}\n" in page, section


def test_the_cli_page_holds_every_commands_help() -> None:
    page = reference.cli_page()
    assert "## claw-stream up\n" in page and "### claw-stream topics apply\n" in page
    assert "Usage: claw-stream connect" in page


def test_the_http_page_lists_the_doors_and_the_rl_routes() -> None:
    page = reference.http_page(reference.openapi())
    for route in ("/chat/completions", "/messages", "/responses", "/rl/start_session"):
        assert f"| `{route}` |" in page, route
    assert "`/v1`, `/{session_id}/v1`" in page  # the base URLs each door is served under
