"""Gateway overhead against direct calls and the LiteLLM proxy, measured in one run.

Starts a fast stub upstream that speaks vLLM's protocol (bench/stub_upstream.py), a private
Tansu broker and PostgreSQL, the gateway with Step publishing on, and — when LiteLLM's proxy is
installed (`litellm[proxy]`, looked for on PATH and in .cache/litellm-venv) — a LiteLLM proxy in
front of the same stub. 32 concurrent clients send realistic bodies (20-message history,
5 tools), stream and non-stream. Prints req/s, p50/p99 latency and the latency each proxy adds
(one client; the targets take turns in short rounds), and the gateway's CPU time per call.

The gateway is also measured on its Anthropic Messages and OpenAI Responses routes, with the
same conversation in each API's own shape (translated to chat completions and back, one Step
per call); their added latency is taken against the same direct chat call.

With `--openclaw` the chat bodies are OpenClaw's own (the 60 KB main-line request of
`tests/fixtures/agents/openclaw/session.jsonl`, a 48 KB system prompt): the same on every call, as
its system prompt and tools are.

Run: python bench/gateway_bench.py [--seconds 8] [--clients 32] [--workers 1] [--rounds 5]
        [--openclaw]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from claw_stream.bus.kafka import wait_for_broker  # noqa: E402
from claw_stream.bus.topics import apply_topics  # noqa: E402
from claw_stream.embedded.broker import broker_command  # noqa: E402
from claw_stream.embedded.postgres import EmbeddedPostgres  # noqa: E402
from claw_stream.store import migrate  # noqa: E402
from tests.support.processes import free_port  # noqa: E402

# recorded OpenClaw bodies (tests/fixtures/agents/openclaw/README.md)
OPENCLAW = REPO / "tests" / "fixtures" / "agents" / "openclaw"
LITELLM_KEY = "sk-bench-3f9c2a7e5d1b4c8a9e0f6d2b7a1c5e3f"


def realistic_body(stream: bool) -> dict:
    tools = [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "description": "Does something useful with a file or a URL. " * 3,
                "parameters": {
                    "type": "object",
                    "properties": {
                        "path": {"type": "string"},
                        "mode": {"type": "string", "enum": ["r", "w"]},
                    },
                    "required": ["path"],
                },
            },
        }
        for i in range(5)
    ]
    messages: list[dict] = [{"role": "system", "content": "You are a careful coding agent. " * 40}]
    for i in range(19):
        if i % 2 == 0:
            messages.append(
                {
                    "role": "user",
                    "content": f"Please look at file number {i} and tell me what it does. " * 3,
                }
            )
        else:
            messages.append(
                {
                    "role": "assistant",
                    "content": f"File {i} parses configuration and validates it. " * 3,
                }
            )
    return {
        "model": "policy",
        "messages": messages,
        "tools": tools,
        "max_tokens": 64,
        "stream": stream,
    }


def openclaw_body(stream: bool) -> dict:
    """OpenClaw's third request of its `agent --local` session: 48 KB system prompt, 12 tools."""
    lines = (OPENCLAW / "session.jsonl").read_text().splitlines()
    body = json.loads(lines[2])["body"]
    return body | {"model": "policy", "stream": stream, "max_tokens": 64}


def messages_body(stream: bool) -> dict:
    """`realistic_body` as Anthropic's Messages API has it."""
    chat = realistic_body(stream)
    return {
        "model": chat["model"],
        "system": chat["messages"][0]["content"],
        "messages": chat["messages"][1:],
        "tools": [
            {
                "name": t["function"]["name"],
                "description": t["function"]["description"],
                "input_schema": t["function"]["parameters"],
            }
            for t in chat["tools"]
        ],
        "max_tokens": chat["max_tokens"],
        "stream": stream,
    }


def responses_body(stream: bool) -> dict:
    """`realistic_body` as OpenAI's Responses API has it."""
    chat = realistic_body(stream)
    return {
        "model": chat["model"],
        "instructions": chat["messages"][0]["content"],
        "input": chat["messages"][1:],
        "tools": [{"type": "function", **t["function"]} for t in chat["tools"]],
        "max_output_tokens": chat["max_tokens"],
        "stream": stream,
    }


async def wait_http(url: str, limit_s: float = 60) -> None:
    deadline = time.monotonic() + limit_s
    async with httpx.AsyncClient() as c:
        while time.monotonic() < deadline:
            try:
                if (await c.get(url, timeout=1)).status_code < 500:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.2)
    raise TimeoutError(url)


async def load(
    url: str, headers_for, stream: bool, clients: int, seconds: float, make_body=realistic_body
) -> tuple[float, list[float], int]:
    body = make_body(stream)
    latencies: list[float] = []
    errors = 0
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)

    async def client(i: int, c: httpx.AsyncClient, stop_at: float) -> None:
        nonlocal errors
        while time.monotonic() < stop_at:
            start = time.perf_counter()
            try:
                if stream:
                    async with c.stream("POST", url, json=body, headers=headers_for(i)) as r:
                        async for _ in r.aiter_bytes():
                            pass
                else:
                    r = await c.post(url, json=body, headers=headers_for(i))
                ok = r.status_code == 200
            except httpx.HTTPError:
                ok = False
            if ok:
                latencies.append(time.perf_counter() - start)
            else:
                errors += 1

    async with httpx.AsyncClient(timeout=60, limits=limits) as c:
        await asyncio.gather(
            *(client(i, c, time.monotonic() + 1.0) for i in range(clients))
        )  # warm-up
        latencies.clear()
        start = time.monotonic()
        await asyncio.gather(*(client(i, c, start + seconds) for i in range(clients)))
        elapsed = time.monotonic() - start
    return len(latencies) / elapsed, latencies, errors


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def load_wrk(
    url: str,
    header: tuple[str, str] | None,
    stream: bool,
    clients: int,
    seconds: float,
    tmp: Path,
    make_body=realistic_body,
) -> tuple[float, float, float, int]:
    """The same load from wrk (C, one thread), so the client is not the bottleneck."""
    body = json.dumps(make_body(stream))
    name, value = header or ("X-Bench", "1")
    script = tmp / f"wrk-{abs(hash((url, stream)))}.lua"
    script.write_text(
        f"wrk.method = 'POST'\nwrk.body = {json.dumps(body)}\n"
        "wrk.headers['Content-Type'] = 'application/json'\n"
        "request = function()\n"
        f"  local value = string.gsub('{value}', '%$N', tostring(math.random({clients})))\n"
        f"  wrk.headers['{name}'] = value\n"
        "  return wrk.format()\nend\n"
    )
    out = subprocess.run(
        [
            "wrk",
            "-t1",
            f"-c{clients}",
            f"-d{int(seconds)}s",
            "--timeout",
            "60s",  # wrk's 2 s would cut off a slow proxy's answers and count them as errors
            "--latency",
            "-s",
            str(script),
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rate = float(re.search(r"Requests/sec:\s+([0-9.]+)", out).group(1))

    def pct(p: str) -> float:
        number, unit = re.search(rf"\s{p}%\s+([0-9.]+)(us|ms|s)", out).groups()
        return float(number) * _UNITS[unit]

    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out
    )
    n_errors = int(errors.group(1)) if errors else 0
    if socket_errors:
        n_errors += sum(int(x) for x in socket_errors.groups())
    return rate, pct("50"), pct("99"), n_errors


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of a process and all its children."""
    process = psutil.Process(pid)
    total = 0.0
    for p in (process, *process.children(recursive=True)):
        with contextlib.suppress(psutil.NoSuchProcess):
            times = p.cpu_times()
            total += times.user + times.system
    return total


def litellm_binary() -> str | None:
    for candidate in (
        shutil.which("litellm"),
        REPO / ".cache" / "litellm-venv" / "bin" / "litellm",
    ):
        if candidate and Path(candidate).exists():
            return str(candidate)
    return None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument(
        "--workers", type=int, default=1, help="processes of the gateway and of LiteLLM alike"
    )
    parser.add_argument("--rounds", type=int, default=5, help="1-client rounds per target")
    parser.add_argument("--round-seconds", type=float, default=2.0)
    parser.add_argument(
        "--openclaw", action="store_true", help="chat bodies: OpenClaw's 60 KB main-line request"
    )
    parser.add_argument(
        "--no-archive-check",
        action="store_true",
        help="also measure a gateway whose broker acknowledgement is the end (no journal)",
    )
    args = parser.parse_args()
    console = Console(width=160)
    tmp = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
    procs: list[subprocess.Popen] = []

    def spawn(
        argv: list[str], name: str, env: dict | None = None, **kw: object
    ) -> subprocess.Popen:
        log = (tmp / f"{name}.log").open("wb")
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, **kw
        )
        procs.append(proc)
        return proc

    try:
        broker_port, stub_port, gw_port, litellm_port = (
            free_port(),
            free_port(),
            free_port(),
            free_port(),
        )
        bootstrap = f"127.0.0.1:{broker_port}"
        spawn(broker_command("127.0.0.1", broker_port), "broker")
        pg = EmbeddedPostgres(tmp / "pg", "127.0.0.1", free_port(), "claw", "claw")
        pg.ensure_initialised()
        spawn(pg.command(), "postgres", **pg.popen_kwargs())
        spawn([sys.executable, str(REPO / "bench" / "stub_upstream.py"), str(stub_port)], "stub")

        async def infra() -> None:
            await wait_for_broker(bootstrap)
            await apply_topics(bootstrap)
            await pg.wait_ready()
            await pg.ensure_database()
            await migrate.upgrade(pg.url)
            await wait_http(f"http://127.0.0.1:{stub_port}/health")

        asyncio.run(infra())
        stub = f"http://127.0.0.1:{stub_port}"
        gateway = spawn(
            [
                sys.executable,
                "-m",
                "claw_stream",
                "gateway",
                "--port",
                str(gw_port),
                "--backends",
                stub,
                "--workers",
                str(args.workers),
            ],
            "gateway",
            env={
                "CLAW_KAFKA_BOOTSTRAP": bootstrap,
                "CLAW_DATABASE_URL": pg.url,
                "CLAW_DATA_DIR": str(tmp / "data"),
                "CLAW_ADMIN_KEY": "bench",
            },
        )
        asyncio.run(wait_http(f"http://127.0.0.1:{gw_port}/healthz"))
        gw = f"http://127.0.0.1:{gw_port}"
        targets: dict[str, tuple[str, tuple[str, str] | None]] = {
            "direct": (f"{stub}/v1/chat/completions", None),
            "claw-stream gateway": (f"{gw}/v1/chat/completions", ("X-Session-Id", "bench-$N")),
            "gateway /v1/messages": (f"{gw}/v1/messages", ("X-Session-Id", "bench-m-$N")),
            "gateway /v1/responses": (f"{gw}/v1/responses", ("X-Session-Id", "bench-r-$N")),
        }
        bodies = {"gateway /v1/messages": messages_body, "gateway /v1/responses": responses_body}
        # the routes of the one gateway process whose CPU time is read
        gateway_targets = {"claw-stream gateway", "gateway /v1/messages", "gateway /v1/responses"}
        if args.no_archive_check:  # the same gateway without the end-to-end journal
            plain_port = free_port()
            spawn(
                [
                    sys.executable,
                    "-m",
                    "claw_stream",
                    "gateway",
                    "--port",
                    str(plain_port),
                    "--backends",
                    stub,
                    "--workers",
                    str(args.workers),
                ],
                "gateway-plain",
                env={
                    "CLAW_KAFKA_BOOTSTRAP": bootstrap,
                    "CLAW_DATABASE_URL": pg.url,
                    "CLAW_DATA_DIR": str(tmp / "data-plain"),
                    "CLAW_ADMIN_KEY": "bench",
                    "CLAW_GATEWAY__ARCHIVE_CHECK": "false",
                },
            )
            asyncio.run(wait_http(f"http://127.0.0.1:{plain_port}/healthz"))
            targets["gateway, no archive check"] = (
                f"http://127.0.0.1:{plain_port}/v1/chat/completions",
                ("X-Session-Id", "plain-$N"),
            )
        binary = litellm_binary()
        if binary:
            config = tmp / "litellm.yaml"
            config.write_text(
                "model_list:\n  - model_name: policy\n    litellm_params:\n      model: openai/policy\n"
                f"      api_base: {stub}/v1\n      api_key: unused\n"
                "litellm_settings:\n  drop_params: true\n  set_verbose: false\n"
                f"general_settings:\n  master_key: {LITELLM_KEY}\n"
            )
            spawn(
                [
                    binary,
                    "--config",
                    str(config),
                    "--port",
                    str(litellm_port),
                    "--num_workers",
                    str(args.workers),
                ],
                "litellm",
                env={"LITELLM_LOG": "ERROR"},
            )
            asyncio.run(
                wait_http(f"http://127.0.0.1:{litellm_port}/health/liveliness", limit_s=180)
            )
            targets["LiteLLM proxy"] = (
                f"http://127.0.0.1:{litellm_port}/v1/chat/completions",
                ("Authorization", f"Bearer {LITELLM_KEY}"),
            )
        else:
            console.print(
                "[yellow]litellm not installed: pip install 'litellm[proxy]' to compare[/yellow]"
            )

        use_wrk = shutil.which("wrk") is not None
        if not use_wrk:
            console.print(
                "[yellow]no wrk (apt-get install wrk): the Python load client is a bottleneck[/yellow]"
            )

        def measure(
            url: str, header: tuple[str, str] | None, stream: bool, clients: int, seconds: float
        ):
            name = next(n for n, (u, _) in targets.items() if u == url)
            make_body = bodies.get(name, openclaw_body if args.openclaw else realistic_body)
            if use_wrk:
                return load_wrk(url, header, stream, clients, seconds, tmp, make_body)

            def headers_for(i: int, h: tuple[str, str] | None = header) -> dict[str, str]:
                return {h[0]: h[1].replace("$N", str(i))} if h else {}

            rate, lat, errors = asyncio.run(
                load(url, headers_for, stream, clients, seconds, make_body)
            )
            q = statistics.quantiles(lat, n=100)
            return rate, statistics.median(lat) * 1000, q[98] * 1000, errors

        # Added latency: one client at a time (nothing queues), all of it first, since a
        # proxy may go on working through its backlog after a load test has ended. The
        # targets take turns in short rounds, in alternating order, and each round's added
        # latency is taken against the direct figure of the same round: a noisy spell of the
        # shared machine then weighs on every target alike.
        # Throughput: 32 clients.
        results: dict[tuple[str, bool], tuple[float, float, float, int]] = {}
        rounds: dict[tuple[str, bool], list[tuple[float, float, float, int]]] = {}
        # the gateway's CPU time per call, by route and mode, one figure per round
        cpu_ms: dict[tuple[str, bool], list[float]] = {}
        for stream in (False, True):  # warm-up: connections, sessions, caches
            for url, header in targets.values():
                measure(url, header, stream, 1, 2.0)
        for stream in (False, True):
            for r in range(args.rounds):
                order = list(targets.items())
                for name, (url, header) in order if r % 2 == 0 else reversed(order):
                    cpu_before = cpu_seconds(gateway.pid)
                    figures = measure(url, header, stream, 1, args.round_seconds)
                    rounds.setdefault((name, stream), []).append(figures)
                    if name in gateway_targets:
                        calls = max(1.0, figures[0] * args.round_seconds)
                        cpu_ms.setdefault((name, stream), []).append(
                            1e3 * (cpu_seconds(gateway.pid) - cpu_before) / calls
                        )
        for stream in (False, True):
            for name, (url, header) in targets.items():
                results[(name, stream)] = measure(url, header, stream, args.clients, args.seconds)

        metrics = httpx.get(f"http://127.0.0.1:{gw_port}/metrics").text
        published = sum(
            float(m)
            for m in re.findall(
                r'claw_gateway_steps_total\{outcome="published"\} ([0-9.e+]+)', metrics
            )
        )
        load_by = "wrk" if use_wrk else "httpx"
        table = Table(
            title=f"latency with 1 client, throughput with {args.clients} ({load_by}); "
            + (
                "OpenClaw's 60 KB bodies, 12 tools"
                if args.openclaw
                else "20-message bodies, 5 tools"
            )
            + f"; Steps published; {args.workers} process(es) each"
        )
        for column in (
            "target",
            "mode",
            "p50 ms (1 client)",
            "p99 ms (1 client)",
            "added p50 ms (rounds: min to max)",
            "added p99 ms",
            f"req/s ({args.clients} clients)",
            f"p50 ms ({args.clients})",
            "errors",
        ):
            table.add_column(column, justify="right")
        for (name, stream), (rate, p50_32, _, errors) in results.items():
            mine, direct = rounds[(name, stream)], rounds[("direct", stream)]
            p50 = statistics.median(m[1] for m in mine)
            p99 = statistics.median(m[2] for m in mine)
            added = ("", "")
            if name != "direct":
                per_round = sorted(m[1] - d[1] for m, d in zip(mine, direct, strict=True))
                added = (
                    f"{statistics.median(per_round):.2f} "
                    f"({per_round[0]:.2f} to {per_round[-1]:.2f})",
                    f"{p99 - statistics.median(d[2] for d in direct):.2f}",
                )
            table.add_row(
                name,
                "stream" if stream else "json",
                f"{p50:.2f}",
                f"{p99:.2f}",
                *added,
                f"{rate:.0f}",
                f"{p50_32:.1f}",
                str(errors + sum(m[3] for m in mine)),
            )
        console.print(table)
        console.print(
            f"1-client figures: median of {args.rounds} rounds of {args.round_seconds:g} s per "
            "target, taken in turns; added latency against the direct round beside it"
        )
        for (name, stream), figures in cpu_ms.items():
            console.print(
                f"{name} CPU time per call ({'stream' if stream else 'json'}, 1 client): "
                f"{statistics.median(figures):.2f} ms"
            )
        console.print(f"Steps published by the gateway during the run: {published:.0f}")
        if "LiteLLM proxy" in targets:
            for stream in (False, True):
                ratio = (
                    results[("claw-stream gateway", stream)][0]
                    / results[("LiteLLM proxy", stream)][0]
                )
                console.print(
                    f"gateway / LiteLLM throughput ({'stream' if stream else 'json'}): {ratio:.1f}x"
                )
    finally:
        for proc in reversed(procs):
            proc.send_signal(signal.SIGINT)
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
