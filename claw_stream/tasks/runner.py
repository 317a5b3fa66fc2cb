"""`claw-stream tasks run`: play each task G times through the gateway as a white-box agent.

Each task is a GRPO group: its G attempts are sessions `{run}-{task}-{k}` of group
`{run}-{task}`, named in the URL (`/{session}/{group}/v1/chat/completions`, Claw-R1's
convention), so every call is recorded as live traffic is. The agent runs the tools itself
(Python functions, or commands in a sandboxed scratch directory), the task's checker scores
the outcome, and the session ends with that reward (`/rl/set_reward`, `/rl/end_session`).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx

from claw_stream.names import VERSION_HEADER
from claw_stream.tasks.checkers import score
from claw_stream.tasks.dataset import Task
from claw_stream.tasks.sandbox import Sandbox
from claw_stream.tasks.tools import Tool, tools_of

AgentKind = Literal["tool-call", "terminal", "chat"]
AGENTS: tuple[str, ...] = ("tool-call", "terminal", "chat")
TERMINAL_TOOL = {
    "type": "function",
    "function": {
        "name": "run",
        "description": "Run one command in your working directory and read its output.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}
TERMINAL_SYSTEM = (
    "You work in a terminal. Call the tool `run` with one command at a time (ls, cat, echo, "
    "cp, mv, rm, mkdir, sort, wc, grep, ...; `echo text > file` writes a file). When the task "
    "is done, answer briefly."
)


@dataclass(frozen=True)
class RunOptions:
    agent: AgentKind = "tool-call"
    group_size: int = 2
    model: str | None = None  # default: the gateway's first model
    max_turns: int = 4  # model calls per episode
    max_tokens: int = 128
    temperature: float = 1.0
    concurrency: int = 4  # episodes at once
    seed: int | None = None  # attempt k of a task samples with seed + k
    time_limit_s: float = 5.0  # per terminal command
    output_limit: int = 16_384  # bytes of a terminal command's output
    scratch_dir: Path = Path("scratch")
    keep_scratch: bool = False
    train: bool = True  # False (evaluation): side calls the pipeline never trains, no reward
    # an engine's own URL, no gateway (a candidate's evaluation): plain /v1/chat/completions,
    # no session, nothing recorded
    direct: bool = False
    # dynamic sampling (DAPO): draw tasks, going round the set again with new seeds, until
    # this many groups have signal (rewards not all equal), or `max_draws` groups were played;
    # None: every task once
    signal_groups: int | None = None
    max_draws: int | None = None  # default: 4 x signal_groups
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])


@dataclass(frozen=True)
class Episode:
    task_id: str
    group_id: str
    session_id: str
    attempt: int
    reward: float | None  # None: the episode failed before the checker could score it
    version: int
    calls: int
    tool_calls: int
    answer: str
    error: str | None = None

    @property
    def passed(self) -> bool:
        return self.reward is not None and self.reward > 0


@dataclass
class RunReport:
    episodes: list[Episode] = field(default_factory=list)

    def groups(self) -> dict[str, list[Episode]]:
        by: dict[str, list[Episode]] = defaultdict(list)
        for e in self.episodes:
            by[e.group_id].append(e)
        return by

    @property
    def flat_groups(self) -> list[str]:
        """Groups whose scored attempts all got the same reward: under group normalisation
        every advantage is zero, so the trainer sets them aside (nothing to learn)."""
        return [
            g
            for g, xs in self.groups().items()
            if len(rewards := [e.reward for e in xs if e.reward is not None]) > 1
            and len(set(rewards)) == 1
        ]

    def per_task(self) -> list[tuple[str, int, int, float]]:
        """(task, attempts, passed, mean reward) by task, in dataset order."""
        by: dict[str, list[Episode]] = defaultdict(list)
        for e in self.episodes:
            by[e.task_id].append(e)
        return [
            (t, len(xs), sum(e.passed for e in xs), _mean([e.reward for e in xs]))
            for t, xs in by.items()
        ]

    def per_version(self) -> list[tuple[int, int, float, float]]:
        """(version, episodes, pass rate, mean reward) by the version that answered last."""
        by: dict[int, list[Episode]] = defaultdict(list)
        for e in self.episodes:
            by[e.version].append(e)
        return [
            (v, len(xs), sum(e.passed for e in xs) / len(xs), _mean([e.reward for e in xs]))
            for v, xs in sorted(by.items())
        ]

    @property
    def errors(self) -> list[Episode]:
        return [e for e in self.episodes if e.error is not None]

    @property
    def pass_rate(self) -> float:
        scored = [e for e in self.episodes if e.reward is not None]
        return sum(e.passed for e in scored) / len(scored) if scored else 0.0


def _named(call: dict[str, Any]) -> tuple[str, str]:
    """A tool call's name and its arguments as sent (JSON text; "" when none)."""
    function = call.get("function") or {}
    sent = function.get("arguments") or ""
    return str(function.get("name", "")), sent if isinstance(sent, str) else json.dumps(sent)


def _has_signal(group: list[Episode]) -> bool:
    """At least two different rewards among the group's scored attempts."""
    return len({e.reward for e in group if e.reward is not None}) > 1


def _mean(values: list[float | None]) -> float:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else 0.0


class GatewayError(RuntimeError):
    """The gateway answered an error; the message carries its OpenAI-shaped text."""


def _raise_for(response: httpx.Response, what: str) -> None:
    if response.status_code >= 400:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text[:300]
        raise GatewayError(f"{what}: {response.status_code} {message}")


async def first_model(http: httpx.AsyncClient, admin_key: str) -> str:
    r = await http.get("/v1/models", headers={"Authorization": f"Bearer {admin_key}"})
    _raise_for(r, "GET /v1/models")
    return str(r.json()["data"][0]["id"])


class Agent:
    """One episode of one task: the model, the tools and the checker, through the gateway."""

    def __init__(self, http: httpx.AsyncClient, admin_key: str, model: str, opts: RunOptions):
        self.http = http
        self.auth = {"Authorization": f"Bearer {admin_key}"}
        # evaluation: side turns are archived, never trained
        self.call_headers = self.auth if opts.train else {**self.auth, "X-Turn-Type": "side"}
        self.model = model
        self.opts = opts

    async def play(self, task: Task, attempt: int, draw: int = 0) -> Episode:
        """Attempt `attempt` of `task`; `draw` > 0: the task drawn again (dynamic sampling),
        a group of its own with other seeds."""
        opts = self.opts
        group = f"{opts.run_id}-{task.id}" + (f".{draw}" if draw else "")
        session = f"{group}-{attempt}"
        scratch: Path | None = None
        sandbox: Sandbox | None = None
        tools: dict[str, Tool] = {}
        if opts.agent == "terminal":
            scratch = opts.scratch_dir / opts.run_id / session
            sandbox = Sandbox(
                scratch, time_limit_s=opts.time_limit_s, output_limit=opts.output_limit
            )
            sandbox.write_files(task.files)
        elif opts.agent == "tool-call":
            tools = tools_of(task.tools)
        messages: list[dict[str, Any]] = []
        system = task.system or (TERMINAL_SYSTEM if opts.agent == "terminal" else None)
        if system:
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": task.prompt})
        schemas = [TERMINAL_TOOL] if sandbox else [t.schema for t in tools.values()]
        calls = tool_calls = version = 0
        called: list[tuple[str, str]] = []  # (tool, arguments as sent), for partial credit
        answer = ""
        error: str | None = None
        reward: float | None = None
        try:
            for _ in range(opts.max_turns):
                body: dict[str, Any] = {
                    "model": self.model,
                    "messages": messages,
                    "max_tokens": opts.max_tokens,
                    "temperature": opts.temperature,
                }
                if schemas:
                    body["tools"] = schemas
                if opts.seed is not None:
                    body["seed"] = opts.seed + attempt + 1000 * calls + 100_000 * draw
                path = "/v1/chat/completions"
                if not opts.direct:
                    path = f"/{session}/{group}{path}"
                r = await self.http.post(path, json=body, headers=self.call_headers)
                _raise_for(r, "chat completion")
                calls += 1
                version = int(r.headers.get(VERSION_HEADER, version))
                message = r.json()["choices"][0]["message"]
                answer = message.get("content") or ""
                wanted = message.get("tool_calls") or []
                if not wanted:
                    break
                messages.append(
                    {"role": "assistant", "content": message.get("content"), "tool_calls": wanted}
                )
                for call in wanted:
                    tool_calls += 1
                    name, sent = _named(call)
                    called.append((name, sent))
                    result = await self._tool(name, sent or "{}", tools, sandbox)
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
            reward = score(task, answer, scratch, called)
            if opts.train:
                await self._post("/rl/set_reward", {"session_id": session, "reward": reward})
        except (GatewayError, httpx.HTTPError, ValueError) as exc:
            error = f"{type(exc).__name__}: {exc}"
        finally:
            try:
                if not opts.direct:
                    await self._post("/rl/end_session", {"session_id": session})
            except (GatewayError, httpx.HTTPError) as exc:
                error = error or f"end_session: {exc}"
            if scratch is not None and not opts.keep_scratch:
                shutil.rmtree(scratch, ignore_errors=True)
        return Episode(
            task.id, group, session, attempt, reward, version, calls, tool_calls, answer, error
        )

    async def _tool(
        self, name: str, arguments: str, tools: dict[str, Tool], sandbox: Sandbox | None
    ) -> str:
        if sandbox is not None:
            if name != "run":
                return f"error: no tool {name!r}; call run"
            try:
                command = json.loads(arguments).get("command")
            except (ValueError, AttributeError):
                command = None
            if not isinstance(command, str):
                return 'error: run needs {"command": "..."}'
            return (await sandbox.run(command)).for_model()
        tool = tools.get(name)
        if tool is None:
            return f"error: no tool {name!r}; the tools are {', '.join(tools) or 'none'}"
        return await tool.call(arguments)

    async def _post(self, path: str, body: dict[str, Any]) -> None:
        r = await self.http.post(path, json=body, headers=self.auth)
        _raise_for(r, f"POST {path}")


async def run_tasks(
    gateway: str,
    admin_key: str,
    tasks: list[Task],
    opts: RunOptions,
    on_episode: Callable[[Episode], None] | None = None,
) -> RunReport:
    """Every task G times, `concurrency` episodes at once; the report holds each episode."""
    if opts.agent == "tool-call":
        for task in tasks:
            tools_of(task.tools)  # a tool that cannot be imported stops the run before it starts
    report = RunReport()
    gate = asyncio.Semaphore(opts.concurrency)
    async with httpx.AsyncClient(base_url=gateway.rstrip("/"), timeout=600) as http:
        model = opts.model or await first_model(http, admin_key)
        agent = Agent(http, admin_key, model, opts)

        async def one(task: Task, attempt: int, draw: int = 0) -> Episode:
            async with gate:
                episode = await agent.play(task, attempt, draw)
            report.episodes.append(episode)
            if on_episode is not None:
                on_episode(episode)
            return episode

        if opts.signal_groups is None:
            await asyncio.gather(*(one(task, k) for task in tasks for k in range(opts.group_size)))
        else:
            await _until_signal(tasks, opts, one)
    order = {t.id: i for i, t in enumerate(tasks)}
    report.episodes.sort(key=lambda e: (order[e.task_id], e.group_id, e.attempt))
    return report


async def _until_signal(
    tasks: list[Task],
    opts: RunOptions,
    one: Callable[[Task, int, int], Awaitable[Episode]],
) -> None:
    """Groups drawn round the task set until `signal_groups` of them have signal: as many
    groups in flight as the episodes' concurrency keeps busy, and no more drawn than could
    still be needed."""
    assert opts.signal_groups is not None
    wanted = opts.signal_groups
    limit = opts.max_draws or 4 * wanted
    in_flight = max(1, -(-opts.concurrency // opts.group_size))
    drawn = with_signal = 0
    running: set[asyncio.Task[bool]] = set()

    async def group(n: int) -> bool:
        task, draw = tasks[n % len(tasks)], n // len(tasks)
        episodes = await asyncio.gather(*(one(task, k, draw) for k in range(opts.group_size)))
        return _has_signal(list(episodes))

    while True:
        while drawn < limit and len(running) < in_flight and with_signal + len(running) < wanted:
            running.add(asyncio.ensure_future(group(drawn)))
            drawn += 1
        if not running:
            return
        done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
        with_signal += sum(t.result() for t in done)
