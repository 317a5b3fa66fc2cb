"""opencode, aider, Hermes Agent and OpenClaw from their registries, unchanged, through a real
gateway, engine, broker and Postgres after `claw-stream connect AGENT`: one turn run
non-interactively, then a second turn of the same conversation, which the gateway files in one
session; their side calls (titles, summaries) marked side; every call one Step whose prompt ids
are the engine's tokenization of what the agent sent.

The engine serves a tiny model of 32k context (`long_model`): their prompts fit, and it
answers the sea question briefly. Hermes Agent refuses any model of less than 64,000 tokens of
context: for it the same model is served with 64k (`wide_gateway`)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from claw_stream.bus.topics import apply_topics

from ..support.coding_agents import agent_env, install
from ..support.engine import ADMIN_KEY, SEA, EngineProcess
from ..support.gateway import GatewayProcess, check_exact_tokens, read_steps
from ..support.python_agents import agent_env as python_agent_env
from ..support.python_agents import install as pip_install
from ..support.python_agents import require

KEY = "any-key"


@pytest.fixture(scope="module")
def tokenizer(long_model: Path) -> Any:
    return AutoTokenizer.from_pretrained(long_model)


@pytest.fixture(scope="module")
def npm_agents() -> dict[str, Path]:
    commands, why = install()
    require(Path() if commands else None, why)
    return commands


def connect(agent: str, gateway: GatewayProcess, home: Path, *more: str) -> str:
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
            *more,
        ],
        capture_output=True,
        text=True,
        env=agent_env(HOME=str(home), CLAW_ADMIN_KEY=ADMIN_KEY),
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def run(command: list[str], home: Path, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environment = python_agent_env if "python-agents" in command[0] else agent_env
    done = subprocess.run(
        command,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        env=environment(HOME=str(home), **env),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def check_steps(
    steps: list[Any],
    engine: EngineProcess,
    tokenizer: Any,
    replies: list[str],
    continues: bool = True,
) -> tuple[list[Any], list[Any]]:
    """Every Step has exact tokens; the main ones answered `replies`, in order, and (where the
    agent resends what it sent) each continues the one before; the (main, side) Steps."""
    main = [s for s in steps if s.turn_type == "main"]
    side = [s for s in steps if s.turn_type == "side"]
    assert [s.response.message.content for s in main] == replies, [
        (s.turn_type, s.request.messages[-1].content) for s in steps
    ]
    for step in steps:
        assert step.response_token_ids and step.train
        check_exact_tokens(engine, step, tokenizer, step.response.message.content or "")
    for before, after in zip(main, main[1:] if continues else [], strict=False):
        said = [m.model_dump(exclude_none=True) for m in before.request.messages]
        assert [m.model_dump(exclude_none=True) for m in after.request.messages][
            : len(said)
        ] == said
    return main, side


def test_real_opencode_one_turn_then_a_second_in_one_session(
    npm_agents: dict[str, Path],
    long_gateway: GatewayProcess,
    long_engine: EngineProcess,
    tokenizer: Any,
    tmp_path: Path,
) -> None:
    """`opencode run` after `claw-stream connect opencode`, then `opencode run --session` on
    the session it made: its own session id names the gateway's session; its title call is a
    side call."""
    said = connect("opencode", long_gateway, tmp_path, "--key", KEY)
    assert "holds opencode's full prompt" in said  # 32k: the full profile
    work = tmp_path / "work"
    work.mkdir()
    opencode = str(npm_agents["opencode"])

    def turn(*words: str, session: str | None = None) -> tuple[str, str]:
        resumed = ["--session", session] if session else []
        done = run([opencode, "run", "--format", "json", *resumed, *words], tmp_path, work)
        events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        text = "".join(e["part"]["text"] for e in events if e.get("type") == "text")
        return events[0]["sessionID"], text

    # the prompt as words: opencode quotes an argument that holds spaces
    session, first = turn(*SEA.split())
    assert first.strip(), first  # what it said is the engine's answer: check_steps below
    again, second = turn("And", "once", "more?", session=session)
    assert again == session and second
    steps = read_steps(long_gateway.bootstrap, {f"opencode-{session}"})
    main, side = check_steps(steps, long_engine, tokenizer, [first, second])
    assert all(len(s.request.tools or ()) == 10 for s in main)  # its ten tools
    assert main[0].request.messages[-1].content == SEA
    # its title call: a side call without tools, kept out of the conversation
    assert side and all(not s.request.tools for s in side)
    assert "title" in str(side[0].request.messages[0].content)


def test_real_openclaw_one_turn_then_a_second_in_one_session(
    npm_agents: dict[str, Path],
    long_gateway: GatewayProcess,
    long_engine: EngineProcess,
    tokenizer: Any,
    tmp_path: Path,
) -> None:
    """`openclaw agent --local --session-id s1` after `claw-stream connect openclaw`, twice:
    connect turns on its affinity headers, which name its session (`s1:0`), and the gateway
    files both turns in that one session, the second holding the first answer. At 32k of
    context connect gives it its full profile, with every tool."""
    said = connect("openclaw", long_gateway, tmp_path, "--key", KEY, "--context", "32768")
    assert "small-model profile" not in said, said
    openclaw = str(npm_agents["openclaw"])

    def turn(message: str) -> str:
        done = run(
            [openclaw, "agent", "--local", "--session-id", "s1", "--message", message],
            tmp_path,
            tmp_path,
        )
        return done.stdout

    first = turn(SEA)
    second = turn("And once more?")
    sessions = {
        s.session_id
        for s in read_steps(long_gateway.bootstrap)
        if "running inside OpenClaw" in str(s.request.messages[0].content)
    }
    assert len(sessions) == 1, (sessions, first, second)
    (session,) = sessions
    # its affinity header names it: `s1:0`, its own id and what OpenClaw adds to it
    assert session.startswith("openclaw-s1"), session
    steps = read_steps(long_gateway.bootstrap, {session})
    replies = [s.response.message.content or "" for s in steps if s.turn_type == "main"]
    assert len(replies) == 2, [(s.turn_type, s.request.messages[-1].content) for s in steps]
    # what the engine answered is what OpenClaw printed (the tiny model, sampled at
    # OpenClaw's temperature, said "The sea is calm." or only "The sea")
    assert all(r.strip() for r in replies), replies
    assert replies[0].strip()[:40] in first and replies[1].strip()[:40] in second
    # its runtime context rides in the first call as a user message of its own, which the
    # second call's history leaves out: the second holds the first answer, not its request
    main, _ = check_steps(steps, long_engine, tokenizer, replies, continues=False)
    second_history = [(m.role, m.content) for m in main[1].request.messages]
    assert ("assistant", replies[0]) in second_history
    asked = str(next(m for m in main[0].request.messages if m.role == "user").content)
    assert SEA in asked and "sessionId=s1" in asked  # after its timestamp, before its runtime
    assert len(main[0].request.tools or ()) > 3  # the full profile's tools


def test_real_aider_one_turn_then_a_second_in_one_session(
    long_gateway: GatewayProcess, long_engine: EngineProcess, tokenizer: Any, tmp_path: Path
) -> None:
    """`aider --message` after `claw-stream connect aider`, then `--restore-chat-history` for
    the second turn: aider names no session and does not resend the conversation it sent, so
    connect gave it a session key, which files both turns in its session."""
    aider = str(require(*pip_install("aider")))
    said = connect("aider", long_gateway, tmp_path)
    session = said.split("of session ")[1].split()[0]
    work = tmp_path / "work"
    work.mkdir()
    flags = ["--yes-always", "--no-git", "--no-check-update", "--no-analytics", "--no-pretty"]
    first = run([aider, "--message", SEA, *flags], tmp_path, work)
    second = run(
        [aider, "--message", "And once more?", "--restore-chat-history", *flags], tmp_path, work
    )
    assert "Unknown context window" not in first.stdout  # its context, from connect
    steps = read_steps(long_gateway.bootstrap, {session})
    replies = [s.response.message.content or "" for s in steps if s.turn_type == "main"]
    # the tiny model's words are sampled at the agent's temperature ("The sea is calm.", now
    # and then "The sea calm."): what matters is that the agent said what the engine answered
    assert len(replies) == 2 and replies[0].strip(), replies
    assert replies[0].strip() in first.stdout and replies[1].strip() in second.stdout
    main, side = check_steps(steps, long_engine, tokenizer, replies, continues=False)
    assert not side  # no git: no commit message; a short chat: no summary
    assert main[0].request.messages[0].content.startswith("Act as an expert software developer")
    # the second turn holds the first: aider restored it from its chat history file
    assert [m.content.strip() for m in main[1].request.messages if m.role == "assistant"][
        -2
    ] == replies[0].strip()


@pytest.fixture(scope="module")
def wide_gateway(
    broker: str, database: str, long_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[GatewayProcess, EngineProcess]]:
    """`long_model` served with 64k of context (the engine's max_model_len; Hermes Agent's
    15k-token prompts never reach past the 32k it was made for), and a gateway before it."""
    engine = EngineProcess(
        long_model,
        tmp_path_factory.mktemp("wide-engine"),
        "--served-model-name",
        "policy",
        env={"CLAW_ENGINE__MAX_MODEL_LEN": "65536"},
    )
    asyncio.run(apply_topics(broker))
    gateway = GatewayProcess(broker, database, [engine.base_url], tmp_path_factory.mktemp("wgw"))
    yield gateway, engine
    gateway.stop()
    engine.stop()


def test_real_hermes_agent_one_turn_then_a_second_in_one_session(
    wide_gateway: tuple[GatewayProcess, EngineProcess], tokenizer: Any, tmp_path: Path
) -> None:
    """`hermes chat -q` after `claw-stream connect hermes`, then `--resume` its session: it
    names no session, but resends the conversation, which the gateway joins by its main line."""
    hermes = str(require(*pip_install("hermes")))
    gateway, engine = wide_gateway
    said = connect("hermes", gateway, tmp_path, "--key", KEY)
    assert "28 tools" in said
    work = tmp_path / "work"
    work.mkdir()
    first = run([hermes, "chat", "-Q", "-q", SEA], tmp_path, work)
    assert "session_id:" in first.stderr, first.stdout[-3000:] + first.stderr[-3000:]
    session = first.stderr.split("session_id:")[1].split()[0]  # its id, on stderr
    second = run(
        [hermes, "chat", "-Q", "-q", "And once more?", "--resume", session], tmp_path, work
    )
    ours = [
        s
        for s in read_steps(gateway.bootstrap)
        if str(s.request.messages[0].content).startswith("You are Hermes Agent")
        and s.request.messages[1].content == SEA
        and str(tmp_path) in str(s.request.messages[0].content)
    ]
    assert ours, first.stdout + first.stderr
    (sessions,) = {s.session_id for s in ours}  # one session: the second joined the first
    steps = read_steps(gateway.bootstrap, {sessions})
    replies = [s.response.message.content or "" for s in steps if s.turn_type == "main"]
    # the tiny model's words are sampled at the agent's temperature ("The sea is calm.", now
    # and then "The sea calm."): what matters is that the agent said what the engine answered
    assert len(replies) == 2 and replies[0].strip(), replies
    assert replies[0].strip() in first.stdout and replies[1].strip() in second.stdout
    main, _ = check_steps(steps, engine, tokenizer, replies)
    assert len(main[0].request.tools or ()) == 28  # its hermes-cli toolset
