"""Claude Code and Codex CLI themselves, from npm, unchanged, against a real gateway, engine,
broker and Postgres, after `claw-stream connect` (their recorded requests are replayed in
tests/component/test_coding_agents_recorded.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ..support.coding_agents import agent_env, install
from ..support.engine import SEA
from ..support.gateway import GatewayProcess, read_steps

KEY = ("--key", "any-key")


@pytest.fixture(scope="module")
def agents() -> dict[str, Path]:
    commands, why = install()
    if not commands:
        pytest.skip(why)
    return commands


def run(command: list[str], home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command,
        cwd=home,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        env=agent_env(HOME=str(home), **env),
    )


def connect(agent: str, gateway: GatewayProcess, home: Path) -> None:
    """`claw-stream connect AGENT`, as a user runs it, into the agent's config in `home`."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "claw_stream",
            "connect",
            agent,
            "--base-url",
            gateway.base_url,
            *KEY,
        ],
        capture_output=True,
        text=True,
        env=agent_env(HOME=str(home)),
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_real_claude_code_answers_through_the_gateway(
    agents: dict[str, Path], long_gateway: GatewayProcess, tmp_path: Path
) -> None:
    """`claude -p` after `claw-stream connect claude-code`: nothing else set."""
    connect("claude-code", long_gateway, tmp_path)
    done = run(
        [str(agents["claude"]), "-p", SEA, "--output-format", "json", "--max-turns", "1"], tmp_path
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert not result["is_error"] and result["result"].strip(), result
    steps = read_steps(long_gateway.bootstrap, {f"claude-code-{result['session_id']}"})
    assert steps and all(s.train for s in steps)
    # the agent said what the engine answered, as its Step recorded it (the tiny model says
    # "The sea is calm." nearly always; Claude Code samples at temperature 1, and one run in
    # ~20 drew "Thesystem calm." instead, which reached the agent just as well)
    assert result["result"].strip() == (steps[-1].response.message.content or "").strip()


def test_real_codex_answers_through_the_gateway(
    agents: dict[str, Path], long_gateway: GatewayProcess, tmp_path: Path
) -> None:
    """`codex exec` after `claw-stream connect codex`, its key in the variable it names."""
    connect("codex", long_gateway, tmp_path)
    done = run(
        [str(agents["codex"]), "exec", "--skip-git-repo-check", "--json", SEA],
        tmp_path,
        CLAW_STREAM_API_KEY="any-key",
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    thread = next(e["thread_id"] for e in events if e.get("type") == "thread.started")
    replies = [
        e["item"]["text"]
        for e in events
        if e.get("type") == "item.completed" and e["item"].get("type") == "agent_message"
    ]
    assert replies and replies[-1].strip(), done.stdout[-3000:]
    steps = read_steps(long_gateway.bootstrap, {f"codex-{thread}"})
    assert steps and all(s.turn_type == "main" for s in steps)
    # what the agent said is what the engine answered (sampled: see the Claude Code test)
    assert replies[-1].strip() == (steps[-1].response.message.content or "").strip()
