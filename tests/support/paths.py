"""Where the repository and the tests' cache are."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Where slow, reusable artefacts (the converted model) are kept between test runs.
CACHE = Path(os.environ.get("CLAW_TEST_CACHE", REPO / ".cache" / "tests"))
# ../shared beside the checkout (CI), or where CLAW_SHARED says (a git worktree elsewhere)
SHARED = Path(os.environ.get("CLAW_SHARED", REPO.parent / "shared"))
