"""Where the repository and the tests' cache are."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Where slow, reusable artefacts (the converted model) are kept between test runs.
CACHE = Path(os.environ.get("CLAW_TEST_CACHE", REPO / ".cache" / "tests"))
# What real agents sent (OpenClaw, Claude Code, Codex), recorded: see its README
AGENTS = REPO / "tests" / "fixtures" / "agents"
