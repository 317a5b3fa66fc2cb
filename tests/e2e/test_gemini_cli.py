"""Gemini CLI (npm `@google/gemini-cli`), unchanged, through the Gemini door of a real gateway,
engine, broker and Postgres, after `claw-stream connect gemini`: one turn (`gemini -p`), then a
second turn of the same conversation (`gemini --resume <its session id> -p`).

Gemini CLI names no session on the wire (its session id stays in its own files): the gateway
files its conversation as one session by the main line each call extends. The engine serves
the tiny model of 32k context (`long_model`), which holds Gemini CLI's 8.6k-token prompt."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from ..support.coding_agents import agent_env, install
from ..support.engine import SEA, EngineProcess
from ..support.gateway import GatewayProcess, check_exact_tokens, read_steps

SKY = "And one about the sky."


@pytest.fixture(scope="module")
def gemini() -> Path:
    commands, why = install()
    if not commands:
        pytest.skip(why)
    return commands["gemini"]


@pytest.fixture(scope="module")
def tokenizer(long_model: Path) -> Any:
    return AutoTokenizer.from_pretrained(long_model)


def connect(gateway: GatewayProcess, home: Path) -> None:
    """`claw-stream connect gemini`, as a user runs it, into `home/.gemini/`."""
    done = subprocess.run(
        [sys.executable, "-m", "claw_stream", "connect", "gemini", "--base-url", gateway.base_url],
        capture_output=True,
        text=True,
        env=agent_env(HOME=str(home)),
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def ask(gemini: Path, home: Path, project: Path, *args: str) -> dict[str, Any]:
    """`gemini ... -o json` in `project`; its JSON result."""
    done = subprocess.run(
        [str(gemini), *args, "--output-format", "json"],
        cwd=project,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        env=agent_env(HOME=str(home)),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout[done.stdout.index("{") :])
    assert "error" not in result, result
    return result


def test_real_gemini_cli_one_turn_then_a_conversation_of_two(
    gemini: Path,
    long_gateway: GatewayProcess,
    long_engine: EngineProcess,
    tokenizer: Any,
    tmp_path: Path,
) -> None:
    home, project = tmp_path, tmp_path / "project"
    project.mkdir()
    connect(long_gateway, home)
    # the user trusts the project (its trust dialog writes this): ~/.gemini/.env, where
    # connect put the base URL and key, is read in a trusted folder only
    (home / ".gemini" / "trustedFolders.json").write_text(
        json.dumps({str(project): "TRUST_FOLDER"})
    )
    first = ask(gemini, home, project, "-p", SEA)
    assert first["response"].strip(), first  # the engine's answer: compared with its Step below
    # the same conversation, continued as Gemini CLI continues one: by its session id
    second = ask(gemini, home, project, "--resume", first["session_id"], "-p", SKY)
    # this test's calls: its project's path is in the session context Gemini CLI sends
    steps = [s for s in read_steps(long_gateway.bootstrap) if str(project) in s.model_dump_json()]
    # sampled at its temperature (1), the tiny model now and then ends at once, and Gemini CLI
    # asks again: those calls are Steps too, without an answer
    main = [s for s in steps if s.turn_type == "main" and s.response.message.content]
    assert len(main) == 2, [(s.session_id, s.turn_type) for s in steps]
    # it names no session: the gateway filed both turns as one, by the main line
    seen = [  # what to read when they are not (1 of ~6 fresh-clone runs so far)
        (s.session_id, s.turn_type, len(s.request.messages), s.response.message.content)
        for s in steps
    ]
    assert main[0].session_id == main[1].session_id, seen
    assert main[0].session_id.startswith("c-")
    assert main[0].turn_index < main[1].turn_index and all(s.train for s in main)
    assert [m.role for m in main[1].request.messages] == ["system", "user", "assistant", "user"]
    assert main[1].request.messages[2].content == first["response"]
    assert main[1].request.messages[3].content == SKY
    check_exact_tokens(long_engine, main[0], tokenizer, first["response"])
    check_exact_tokens(long_engine, main[1], tokenizer, second["response"])
    # what it counts its context by (to compress in time): the prompt the gateway reports
    (tokens,) = [model["tokens"] for model in second["stats"]["models"].values()]
    assert tokens["prompt"] == len(main[1].prompt_token_ids)
    # its utility calls, if it made any, carry no tools and are side calls
    assert all(not s.request.tools for s in steps if s.turn_type == "side")
