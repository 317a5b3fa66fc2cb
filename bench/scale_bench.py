"""A load simulation: many users' conversations through the whole stack, for minutes.

`claw-stream up --no-engine` (broker, Postgres, `--gateways M` gateway processes, `--workers N`
stream workers, the real trainer on SmolLM2-135M with every tenant's own adapter) in front of a
stand-in engine (`bench/stub_upstream.py --conversation`: vLLM's dialect with token ids and
logprobs, a session's prompt ids continuing its previous prompt and answer ids, answers after
`--engine-ms` asleep, LoRA and weight pushes taken as the built-in engine takes them, and under
`/judge` a PRM judge that reads the user's next words), so what it measures is our parts, not a
model.

`--sessions` simulated users of `--tenants` tenants (each tenant an API key of its own in
`tenants.keys`) each hold one conversation at a time: a first request, then after a think time
(exponential, mean `--think-s`) the next message with the answer in the history: a follow-up
question, "Thanks, ..." or "No, that is wrong ..."; after 3-8 turns (`--turns`) the last call
says `X-Session-Done` and the user starts a new conversation, so `--sessions` stay concurrent.
Half the calls stream (`--stream-share`). The defaults, 1,000 users thinking 30 s, make ~33 calls
a second (one call every 30 s per active user). The judge is the stand-in's: where the user's
reaction (the worker's `reaction` source) says nothing, it answers the PRM prompt with a box.

Prints, with a progress bar while it runs: per-stage throughput (calls/s through the gateway;
records/s on each topic; the trainer's samples/s), consumer lag per stage every `--sample-s`
(the lag module the gateway and console use: `claw_stream/bus/lag.py`), the latency the gateway
adds (paired: a share `--probe-share` of calls is sent again straight to the stand-in, the
difference is what the gateway added), memory (PSS) per concurrent session of the gateway and
the workers and per tenant adapter of the trainer, CPU seconds per call of every service,
Postgres rows and row writes per turn, topic bytes per turn. `--plots DIR` writes
`scale-lag.png` and `scale-throughput.png` there. The stack first idles `--idle-s` seconds, so
each service's CPU per call is given less what it spends with no traffic. The machine may be
shared: below `--min-free-gb` of free memory the users stop and the trainer is frozen.

Run: python bench/scale_bench.py [--minutes 10] [--sessions 1000] [--tenants 100]
        [--think-s 30] [--gateways 1] [--workers 1] [--plots docs]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import orjson
import psutil
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.stack import Stack, new_stack, running  # noqa: E402
from bench.stub_upstream import WORDS  # noqa: E402
from claw_stream.bus.kafka import make_consumer, partitions_of, read_to_end  # noqa: E402
from claw_stream.bus.lag import LagReader, Stage  # noqa: E402
from claw_stream.bus.topics import specs_for  # noqa: E402
from claw_stream.names import Topics  # noqa: E402
from claw_stream.trainer.config import TrainerSettings  # noqa: E402
from claw_stream.worker.config import WorkerSettings  # noqa: E402

TOPICS = Topics()
WORKER_GROUP = WorkerSettings().app_id
TRAINER_GROUP = TrainerSettings().group_id
# what each stage consumes (the worker's group reads steps and events, turns, judgements)
STAGES = [
    Stage("worker", WORKER_GROUP, (TOPICS.steps, TOPICS.session_events)),
    Stage("judge", WORKER_GROUP, (TOPICS.turns,)),
    Stage("assemble", WORKER_GROUP, (TOPICS.judgements,)),
    Stage("trainer", TRAINER_GROUP, (TOPICS.samples,)),
]
ALL_TOPICS = [
    TOPICS.steps,
    TOPICS.session_events,
    TOPICS.turns,
    TOPICS.judgements,
    TOPICS.samples,
    TOPICS.weights,
    TOPICS.dlq,
]
THANKS = ["Thanks, that is exactly what I needed.", "Great, thank you!", "Perfect, thanks."]
WRONG = ["No, that is wrong: {w} does not work like that. Try again.", "No, that is wrong."]
FOLLOW = [
    "And what about {w} {w2}? Please go into more detail.",
    "Can you give an example with {w} and {w2}?",
    "How would that change if {w} were {w2}?",
]
JUDGE = (
    "the stand-in's PRM judge (/judge: 'thanks' -> \\boxed{1}, 'wrong' -> \\boxed{-1}, else 1 or "
    "0 by a hash), asked where the user's reaction (the worker's `reaction` source) abstains"
)


_GIVEN: set[int] = set()


def bench_port() -> int:
    """A free loopback port of 29000-31999, a range no test process takes (they count from
    12000: tests/support/processes.py) on this shared machine, never one given before; 100
    apart, so that the workers' metrics ports after the first (`up --workers`) are free too."""
    slots = list(range(29000, 32000, 100))
    random.shuffle(slots)
    for port in slots:
        if port in _GIVEN:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _GIVEN.add(port)
        return port
    raise RuntimeError("no free port in 29000-31999")


def tenant_name(i: int) -> str:
    return f"t{i:03d}"


def tenant_key(i: int) -> str:
    return f"scale-key-{i:03d}"


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


# --- the users -------------------------------------------------------------------------------


@dataclass
class Tally:
    calls: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    error_examples: list[str] = field(default_factory=list)
    latency: list[float] = field(default_factory=list)  # seconds, every answered call
    latency_stream: list[float] = field(default_factory=list)
    latency_json: list[float] = field(default_factory=list)
    probes: list[tuple[float, float]] = field(default_factory=list)  # (gateway, direct)
    replies: Counter[str] = field(default_factory=Counter)
    sessions_started: int = 0
    sessions_done: int = 0  # ended by their last call's X-Session-Done
    open: dict[str, int] = field(default_factory=dict)  # session -> tenant, not yet done

    def failed(self, kind: str, detail: str) -> None:
        self.errors[kind] += 1
        if len(self.error_examples) < 5:
            self.error_examples.append(f"{kind}: {detail[:200]}")


class CallFailed(Exception):
    pass


class Users:
    """`sessions` simulated users, each an async loop of conversations."""

    def __init__(self, args: argparse.Namespace, gateway: str, direct: str):
        self.args = args
        self.url = f"{gateway}/v1/chat/completions"
        self.direct = f"{direct}/v1/chat/completions"
        self.gateway = gateway
        self.tally = Tally()
        self.stop = asyncio.Event()
        self.systems = {
            t: f"You are the assistant of tenant {tenant_name(t)}. "
            + words(random.Random(f"system{t}"), args.system_words)
            for t in range(args.tenants)
        }
        self.lo, self.hi = (int(x) for x in args.turns.split("-"))

    async def pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), seconds)

    async def call(
        self, http: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str]
    ) -> tuple[str, float]:
        started = time.perf_counter()
        async with http.post(url, data=orjson.dumps(body), headers=headers) as r:
            if r.status != 200:
                raise CallFailed(f"{r.status} {(await r.text())[:300]}")
            if body.get("stream"):
                parts = []
                async for line in r.content:
                    if line.startswith(b"data: {"):
                        chunk = orjson.loads(line[6:])
                        for choice in chunk.get("choices") or ():
                            parts.append((choice.get("delta") or {}).get("content") or "")
                content = "".join(parts)
            else:
                answer = orjson.loads(await r.read())
                content = answer["choices"][0]["message"]["content"]
        return content, time.perf_counter() - started

    async def user(self, slot: int, http: aiohttp.ClientSession) -> None:
        args, tally = self.args, self.tally
        rng = random.Random(slot)
        tenant = slot % args.tenants
        auth = {"Authorization": f"Bearer {tenant_key(tenant)}"}
        await self.pause(rng.uniform(0, args.think_s))  # users arrive over one think time
        while not self.stop.is_set():
            sid = f"scale-{slot}-{uuid.uuid4().hex[:12]}"
            tally.sessions_started += 1
            tally.open[sid] = tenant
            turns = rng.randint(self.lo, self.hi)
            history: list[dict[str, Any]] = [{"role": "system", "content": self.systems[tenant]}]
            for k in range(turns):
                if self.stop.is_set():
                    return
                if k == 0:
                    text = f"Please explain how {words(rng, 2)} works. " + words(rng, 12)
                else:
                    kind = rng.choices(("more", "thanks", "wrong"), (0.5, 0.3, 0.2))[0]
                    tally.replies[kind] += 1
                    pick = {"more": FOLLOW, "thanks": THANKS, "wrong": WRONG}[kind]
                    text = rng.choice(pick).format(w=rng.choice(WORDS), w2=rng.choice(WORDS))
                history.append({"role": "user", "content": text})
                stream = rng.random() < args.stream_share
                body = {"model": "policy", "messages": history, "max_tokens": 96, "stream": stream}
                headers = {**auth, "X-Session-Id": sid}
                last = k == turns - 1
                if last:
                    headers["X-Session-Done"] = "true"
                try:
                    content, seconds = await self.call(http, self.url, body, headers)
                except (CallFailed, aiohttp.ClientError, TimeoutError) as exc:
                    tally.failed(type(exc).__name__, str(exc))
                    break  # the conversation is abandoned; a new one starts after a pause
                tally.calls += 1
                tally.latency.append(seconds)
                if stream:
                    tally.latency_stream.append(seconds)
                else:
                    tally.latency_json.append(seconds)
                if rng.random() < args.probe_share:
                    await self.probe(http, body, stream, seconds)
                history.append({"role": "assistant", "content": content})
                if last:
                    tally.open.pop(sid, None)
                    tally.sessions_done += 1
                else:
                    await self.pause(min(rng.expovariate(1 / args.think_s), 6 * args.think_s))
            await self.pause(rng.expovariate(1 / args.think_s))

    async def probe(
        self, http: aiohttp.ClientSession, body: dict[str, Any], stream: bool, gateway_s: float
    ) -> None:
        """The same request straight to the stand-in, as the gateway sends it (token ids and
        logprobs asked for): the difference is what the gateway added."""
        direct = {**body, "return_token_ids": True, "logprobs": True}
        if stream:
            direct["stream_options"] = {"include_usage": True}
        try:
            _, seconds = await self.call(http, self.direct, direct, {})
        except (CallFailed, aiohttp.ClientError, TimeoutError) as exc:
            self.tally.failed("probe " + type(exc).__name__, str(exc))
            return
        self.tally.probes.append((gateway_s, seconds))

    async def end_open(self, http: aiohttp.ClientSession) -> int:
        """End the conversations the run's end cut short, so their turns close now."""
        gate = asyncio.Semaphore(16)

        async def end(sid: str, tenant: int) -> bool:
            async with gate:
                headers = {"Authorization": f"Bearer {tenant_key(tenant)}", "X-Session-Id": sid}
                try:
                    async with http.post(
                        f"{self.gateway}/rl/end_session", json={}, headers=headers
                    ) as r:
                        return r.status == 200
                except aiohttp.ClientError:
                    return False

        done = await asyncio.gather(*(end(s, t) for s, t in list(self.tally.open.items())))
        return sum(done)


# --- the services' processes -----------------------------------------------------------------


class Service:
    """A service's processes: its root and (unless `alone`) all of its descendants."""

    def __init__(self, name: str, pid: int, alone: bool = False):
        self.name = name
        self.root = psutil.Process(pid)
        self.alone = alone

    def procs(self) -> list[psutil.Process]:
        if self.alone:
            return [self.root]
        try:
            return [self.root, *self.root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def cpu_s(self) -> float:
        """User + system seconds of the live processes and of the children they reaped (a
        Postgres backend that exited counts in its postmaster's)."""
        total = 0.0
        for p in self.procs():
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                t = p.cpu_times()
                total += t.user + t.system
                if not self.alone:
                    total += t.children_user + t.children_system
        return total

    @staticmethod
    def snapshot(services: list[Service]) -> dict[str, float]:
        return {s.name: s.cpu_s() for s in services}

    @staticmethod
    def since(services: list[Service], before: dict[str, float]) -> dict[str, float]:
        return {s.name: s.cpu_s() - before[s.name] for s in services}

    def memory_mib(self) -> float:
        """Proportional set size summed: shared pages (Postgres' buffers, a forked gateway's
        code) counted once."""
        total = 0
        for p in self.procs():
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                total += p.memory_full_info().pss
        return total / 2**20


class MemoryGuard:
    """The machine is shared: when its free memory falls below `min_free_gb`, the users stop
    and the trainer (the one service whose memory grows by the gigabyte) is frozen (SIGSTOP)
    until the bench has read its figures."""

    def __init__(self, min_free_gb: float, trainer: Service, console: Console):
        self.floor = min_free_gb * 2**30
        self.trainer = trainer
        self.console = console
        self.why: str | None = None

    def short(self, now: float) -> bool:
        free = psutil.virtual_memory().available
        if free >= self.floor:
            return self.why is not None
        if self.why is None:
            self.why = (
                f"at {now:.0f} s only {free / 2**30:.1f} GiB of the machine's memory was free "
                f"(trainer {self.trainer.memory_mib():,.0f} MiB): the users stopped and the "
                "trainer was frozen"
            )
            self.console.print(f"[red]{self.why}[/red]")
            for p in self.trainer.procs():
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.suspend()
        return True

    def release(self) -> None:
        if self.why is not None:
            for p in self.trainer.procs():
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.resume()


def services_of(stack: Stack, standin: subprocess.Popen[bytes]) -> list[Service]:
    info = json.loads((stack.data / "run" / "up.json").read_text())
    out = [
        Service(name, entry["pid"])
        for name, entry in info["services"].items()
        if entry.get("pid") is not None
    ]
    out.append(Service("stand-in engine", standin.pid))
    out.append(Service("bench users", os.getpid(), alone=True))
    return out


def worker_metrics_urls(stack: Stack) -> list[str]:
    info = json.loads((stack.data / "run" / "up.json").read_text())
    return [e["url"] for n, e in info["services"].items() if n.startswith("worker")]


async def scrape(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """A /metrics page: sample name (with labels) -> value."""
    try:
        async with http.get(url, timeout=aiohttp.ClientTimeout(total=5)) as r:
            text = await r.text()
    except (aiohttp.ClientError, TimeoutError):
        return {}
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    return out


# --- the readings ----------------------------------------------------------------------------


@dataclass
class Reading:
    t: float  # seconds since the users started
    calls: int
    errors: int
    ends: dict[str, int]  # records on each topic
    lag: dict[str, int]  # per stage
    trained: float  # samples the trainer trained
    trainer_steps: float
    memory: dict[str, float]  # MiB per service
    cpu: dict[str, float]  # seconds per service
    adapters: int  # tenants whose adapter the trainer has trained
    open_sessions: int


class Monitor:
    def __init__(
        self,
        stack: Stack,
        services: list[Service],
        users: Users,
        http: aiohttp.ClientSession,
        pg: asyncpg.Connection,
    ):
        self.stack = stack
        self.services = services
        self.users = users
        self.http = http
        self.pg = pg
        self.lag = LagReader(f"127.0.0.1:{stack.ports['broker']}", STAGES)
        self.readings: list[Reading] = []
        self.t0 = time.monotonic()

    async def read(self) -> Reading:
        lags = await self.lag.read()
        ends = {x.topic: x.end for x in lags}
        lag: dict[str, int] = Counter()
        for x in lags:
            lag[x.stage] += x.lag
        others = [t for t in ALL_TOPICS if t not in ends]
        tps = await partitions_of(self.lag.consumer, *others)
        for tp, end in (await self.lag.consumer.end_offsets(tps)).items():
            ends[tp.topic] = ends.get(tp.topic, 0) + end
        trainer = await scrape(self.http, f"http://127.0.0.1:{self.stack.ports['trainer']}/metrics")
        adapters = await self.pg.fetchval(
            "SELECT count(DISTINCT policy) FROM weight_versions WHERE policy <> 'policy'"
        )
        memory = {s.name: s.memory_mib() for s in self.services}
        cpu = {s.name: s.cpu_s() for s in self.services}
        tally = self.users.tally
        return Reading(
            t=time.monotonic() - self.t0,
            calls=tally.calls,
            errors=sum(tally.errors.values()),
            ends=ends,
            lag=dict(lag),
            trained=trainer.get("claw_trainer_samples_total", 0.0),
            trainer_steps=trainer.get("claw_trainer_steps_total", 0.0),
            memory=memory,
            cpu=cpu,
            adapters=int(adapters or 0),
            open_sessions=len(tally.open),
        )

    async def sample(self) -> Reading:
        reading = await self.read()
        self.readings.append(reading)
        return reading

    async def run(self, every_s: float) -> None:
        """A reading every `every_s`, the first `every_s` after the last one."""
        while True:
            last = self.readings[-1].t if self.readings else 0.0
            await asyncio.sleep(max(0.0, last + every_s - (time.monotonic() - self.t0)))
            try:
                await self.sample()
            except Exception as exc:  # a reading that failed is a gap in the series
                print(f"reading failed: {exc!r}", file=sys.stderr)


async def topic_bytes(bootstrap: str) -> dict[str, tuple[int, int]]:
    """(records, bytes of keys, values and headers) on each topic."""
    out = {}
    for topic in ALL_TOPICS:
        consumer = make_consumer(bootstrap, group_id=None)
        await consumer.start()
        try:
            tps = await partitions_of(consumer, topic)
            firsts = await consumer.beginning_offsets(tps)
            n = size = 0
            async for r in read_to_end(consumer, dict(firsts)):
                n += 1
                size += max(0, r.serialized_key_size) + max(0, r.serialized_value_size)
                size += sum(len(k) + len(v or b"") for k, v in r.headers or ())
            out[topic] = (n, size)
        finally:
            await consumer.stop()
    return out


async def postgres_tables(pg: asyncpg.Connection) -> list[tuple[str, int, int]]:
    """(table, rows, rows written: inserted + updated + deleted) of every table."""
    stats = await pg.fetch(
        "SELECT relname, n_tup_ins + n_tup_upd + n_tup_del AS writes FROM pg_stat_user_tables"
    )
    out = []
    for row in sorted(stats, key=lambda r: r["relname"]):
        rows = await pg.fetchval(f'SELECT count(*) FROM "{row["relname"]}"')
        out.append((row["relname"], int(rows), int(row["writes"])))
    return out


# --- the report ------------------------------------------------------------------------------


def pct(values: list[float], q: int) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f} ms"


def rate(a: Reading, b: Reading, value: float) -> float:
    return value / (b.t - a.t) if b.t > a.t else float("nan")


def slope(points: list[tuple[float, float]]) -> float | None:
    """Least squares dy/dx; None with fewer than 3 distinct x."""
    if len({x for x, _ in points}) < 3:
        return None
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    den = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / den


def at(readings: list[Reading], t: float) -> Reading:
    """The first reading at or after t (the last one when none is)."""
    return next((r for r in readings if r.t >= t), readings[-1])


@dataclass
class Phases:
    base: Reading  # before the users started
    ramped: Reading  # every user has arrived
    steady: Reading  # start of the steady window
    end: Reading  # the users stopped
    drained: Reading  # the workers caught up (or the drain timed out)
    drain_s: float


def report(
    console: Console,
    args: argparse.Namespace,
    users: Users,
    readings: list[Reading],
    ph: Phases,
    services: list[Service],
    tables: list[tuple[str, int, int]],
    db_bytes: tuple[int, int],
    topics: dict[str, tuple[int, int]],
    extra: dict[str, Any],
) -> None:
    tally = users.tally
    load_s = ph.end.t - ph.base.t
    turns = next((rows for name, rows, _ in tables if name == "turns"), 0)
    calls = tally.calls

    t = Table(title="scale run", title_justify="left")
    t.add_column("setting")
    t.add_column("value", overflow="fold")
    t.add_row("load", f"{load_s / 60:.1f} min of users, then {ph.drain_s:.0f} s to drain")
    t.add_row(
        "users",
        f"{args.sessions} concurrent sessions of {args.tenants} tenants, {args.turns} turns "
        f"each, think time exponential mean {args.think_s:g} s "
        f"(~{args.sessions / (args.think_s + args.engine_ms / 1000):.0f} calls/s expected), "
        f"{args.stream_share:.0%} streamed, system prompt {args.system_words} words",
    )
    t.add_row(
        "stack",
        f"`claw-stream up --no-engine --gateways {args.gateways} --workers {args.workers}`; "
        f"{extra['partitions']} partitions on claw.steps; trainer on {args.model}, tenants' "
        f"adapters (CLAW_TENANTS__ADAPTERS=all), OMP_NUM_THREADS={args.trainer_threads}",
    )
    t.add_row(
        "engine",
        f"stand-in (bench/stub_upstream.py --conversation), answers 24-64 tokens after "
        f"{args.engine_ms:g} ms asleep",
    )
    t.add_row("judge", f"{JUDGE}, {args.judge_ms:g} ms a request")
    t.add_row("machine", f"{psutil.cpu_count()} CPU cores, load average {extra['load']}")
    if extra["memory_stop"]:
        t.add_row("stopped early", extra["memory_stop"])
    console.print(t)

    # throughput
    t = Table(title="throughput per stage (records/s)", title_justify="left")
    for c in ("stage", "whole load", "steady window", "after the drain"):
        t.add_column(c, justify="right" if c != "stage" else "left")
    steady = f"{ph.steady.t:.0f}-{ph.end.t:.0f} s"
    t.columns[2].header = f"steady ({steady})"

    def row(label: str, f: Any) -> None:
        t.add_row(
            label,
            f"{rate(ph.base, ph.end, f(ph.end) - f(ph.base)):,.2f}",
            f"{rate(ph.steady, ph.end, f(ph.end) - f(ph.steady)):,.2f}",
            f"{rate(ph.base, ph.drained, f(ph.drained) - f(ph.base)):,.2f}",
        )

    row("calls through the gateway (answered)", lambda r: r.calls)
    for topic in ALL_TOPICS[:5]:
        row(f"{topic} records", lambda r, topic=topic: r.ends.get(topic, 0))
    row("trainer: samples trained", lambda r: r.trained)
    row("trainer: optimizer steps (one per tenant batch)", lambda r: r.trainer_steps)
    console.print(t)

    # lag
    t = Table(title="consumer lag (records not yet consumed by the stage's group)")
    t.add_column("stage")
    for c in ("max during load", "at the load's end", "after the drain", "mean during load"):
        t.add_column(c, justify="right")
    during = [r for r in readings if ph.base.t <= r.t <= ph.end.t]
    for name in (s.name for s in STAGES):
        values = [r.lag.get(name, 0) for r in during]
        t.add_row(
            name,
            f"{max(values, default=0):,}",
            f"{ph.end.lag.get(name, 0):,}",
            f"{ph.drained.lag.get(name, 0):,}",
            f"{statistics.fmean(values) if values else 0:,.1f}",
        )
    console.print(t)
    t = Table(title=f"lag over time (every ~{args.sample_s:g} s; a sample of the readings)")
    t.add_column("t", justify="right")
    t.add_column("calls/s", justify="right")
    for stage in STAGES:
        t.add_column(stage.name, justify="right")
    t.add_column("trained/s", justify="right")
    step = max(1, len(readings) // 14)
    shown = readings[::step]
    if shown[-1] is not readings[-1]:
        shown.append(readings[-1])
    for prev, r in zip([readings[0], *shown], shown, strict=False):
        t.add_row(
            f"{r.t:.0f} s",
            f"{rate(prev, r, r.calls - prev.calls):.1f}" if r is not prev else "",
            *(f"{r.lag.get(s.name, 0):,}" for s in STAGES),
            f"{rate(prev, r, r.trained - prev.trained):.2f}" if r is not prev else "",
        )
    console.print(t)

    # latency
    t = Table(title="latency")
    t.add_column("")
    for c in ("n", "p50", "p99"):
        t.add_column(c, justify="right")
    json_lat = tally.latency_json
    t.add_row(
        "client, every call",
        f"{len(tally.latency):,}",
        *(ms(pct(tally.latency, q)) for q in (50, 99)),
    )
    t.add_row("client, JSON calls", f"{len(json_lat):,}", *(ms(pct(json_lat, q)) for q in (50, 99)))
    t.add_row(
        "client, streams",
        f"{len(tally.latency_stream):,}",
        *(ms(pct(tally.latency_stream, q)) for q in (50, 99)),
    )
    gw = [g for g, _ in tally.probes]
    direct = [d for _, d in tally.probes]
    added = [g - d for g, d in tally.probes]
    t.add_row("probes: through the gateway", f"{len(gw):,}", *(ms(pct(gw, q)) for q in (50, 99)))
    t.add_row(
        "probes: straight to the stand-in",
        f"{len(direct):,}",
        *(ms(pct(direct, q)) for q in (50, 99)),
    )
    t.add_row(
        "added by the gateway (paired)", f"{len(added):,}", *(ms(pct(added, q)) for q in (50, 99))
    )
    console.print(t)
    if tally.errors:
        console.print(f"failed calls: {dict(tally.errors)}; e.g. {tally.error_examples}")

    # CPU
    t = Table(title="CPU (user + system seconds, from the users' start to the drain's end)")
    for c in ("service", "seconds", "idle cores", "cores during load", "per call", "marginal"):
        t.add_column(c, justify="right" if c != "service" else "left")
    t.add_column("per unit (marginal)", justify="right")
    steps = ph.drained.ends.get(TOPICS.steps, 0) - ph.base.ends.get(TOPICS.steps, 0)
    trained_load = ph.end.trained - ph.base.trained
    span = ph.drained.t - ph.base.t
    idle_cores: dict[str, float] = extra["idle_cores"]
    sums = [0.0, 0.0, 0.0, 0.0]
    for s in services:
        used = ph.drained.cpu[s.name] - ph.base.cpu[s.name]
        cores = (ph.end.cpu[s.name] - ph.base.cpu[s.name]) / load_s
        marginal = used - idle_cores[s.name] * span  # less what the idle stack spends
        unit = ""
        if s.name.startswith("worker") and steps:
            unit = f"{marginal / steps * 1000:.2f} ms a step"
        elif s.name == "postgres" and turns:
            unit = f"{marginal / turns * 1000:.2f} ms a turn"
        elif s.name == "trainer" and trained_load:
            load_cpu = ph.end.cpu[s.name] - ph.base.cpu[s.name]
            unit = f"{load_cpu / trained_load:.2f} s a sample"
        t.add_row(
            s.name,
            f"{used:,.1f}",
            f"{idle_cores[s.name]:.3f}",
            f"{cores:.2f}",
            f"{used / max(1, calls) * 1000:.2f} ms",
            f"{marginal / max(1, calls) * 1000:.2f} ms",
            unit,
        )
        if s.name != "trainer":
            for i, v in enumerate((used, idle_cores[s.name], cores, marginal)):
                sums[i] += v
    t.add_row(
        "all but the trainer",
        f"{sums[0]:,.1f}",
        f"{sums[1]:.3f}",
        f"{sums[2]:.2f}",
        f"{sums[0] / max(1, calls) * 1000:.2f} ms",
        f"{sums[3] / max(1, calls) * 1000:.2f} ms",
        "",
    )
    console.print(t)

    # memory
    t = Table(title="memory (PSS, MiB)")
    for c in ("service", "before the users", "all users in", "load's end", "per session"):
        t.add_column(c, justify="right" if c != "service" else "left")
    for s in services:
        grow = ph.end.memory[s.name] - ph.base.memory[s.name]
        per = ""
        if s.name.startswith(("gateway", "worker")):
            per = f"{grow * 1024 / args.sessions:.1f} KiB"
        t.add_row(
            s.name,
            f"{ph.base.memory[s.name]:,.0f}",
            f"{ph.ramped.memory[s.name]:,.0f}",
            f"{ph.end.memory[s.name]:,.0f}",
            per,
        )
    console.print(t)
    # the first steps page the model in and size the activations: fit from the tenth adapter on
    # (from half the last count when fewer were trained)
    most = max((r.adapters for r in readings), default=0)
    start = max(2, min(10, most // 2))
    points = [(float(r.adapters), r.memory.get("trainer", 0.0)) for r in readings]
    points = [(a, m) for a, m in points if a >= start]
    per_tenant = slope(points)
    first = next((r for r in readings if r.adapters >= 1), None)
    console.print(
        "trainer: "
        + (
            f"{per_tenant:.1f} MiB per tenant adapter (least squares over {len(points)} readings, "
            f"{points[0][0]:.0f} to {points[-1][0]:.0f} adapters: "
            f"{points[0][1]:,.0f} to {points[-1][1]:,.0f} MiB; "
            f"{first.memory['trainer']:,.0f} MiB with the first adapter)"
            if per_tenant is not None and first is not None
            else "too few tenants' adapters trained to fit MiB per tenant"
        ),
        highlight=False,
    )

    # Postgres and topics
    t = Table(title=f"Postgres ({turns:,} turns, {calls:,} calls)")
    for c in ("table", "rows", "rows per turn", "row writes per turn"):
        t.add_column(c, justify="right" if c != "table" else "left")
    for name, rows, writes in tables:
        if rows or writes:
            t.add_row(
                name, f"{rows:,}", f"{rows / max(1, turns):.2f}", f"{writes / max(1, turns):.2f}"
            )
    all_rows = sum(r for _, r, _ in tables)
    all_writes = sum(w for _, _, w in tables)
    t.add_row(
        "all",
        f"{all_rows:,}",
        f"{all_rows / max(1, turns):.2f}",
        f"{all_writes / max(1, turns):.2f}",
    )
    before, after = db_bytes
    t.add_row(
        "database size",
        f"{after / 2**20:,.0f} MiB",
        f"{(after - before) / max(1, turns) / 1024:.1f} KiB",
        "",
    )
    console.print(t)
    t = Table(title="topics")
    for c in ("topic", "records", "MiB", "bytes per turn", "records per turn"):
        t.add_column(c, justify="right" if c != "topic" else "left")
    for topic, (n, size) in topics.items():
        t.add_row(
            topic,
            f"{n:,}",
            f"{size / 2**20:,.1f}",
            f"{size / max(1, turns):,.0f}",
            f"{n / max(1, turns):.2f}",
        )
    console.print(t)

    # trainer
    t = Table(title="trainer")
    t.add_column("")
    t.add_column("value", justify="right")
    samples_out = ph.end.ends.get(TOPICS.samples, 0) - ph.base.ends.get(TOPICS.samples, 0)
    t.add_row("samples published during load", f"{samples_out:,}")
    t.add_row("samples trained during load", f"{trained_load:,.0f}")
    t.add_row("trainer samples/s during load", f"{rate(ph.base, ph.end, trained_load):.2f}")
    t.add_row("samples published/s during load", f"{rate(ph.base, ph.end, samples_out):.2f}")
    t.add_row("backlog at the load's end (trainer lag)", f"{ph.end.lag.get('trainer', 0):,}")
    t.add_row("backlog after the drain", f"{ph.drained.lag.get('trainer', 0):,}")
    t.add_row("tenants with a trained adapter", f"{ph.drained.adapters}")
    t.add_row(
        "adapter versions pushed to the engine", f"{extra['standin'].get('adapter_loads', 0):,}"
    )
    tr = extra["training"]
    wall = ph.drained.t - ph.base.t
    if tr["steps"]:
        t.add_row(
            "training steps (all run): samples a step, tokens a sample",
            f"{tr['steps']:,}: {tr['samples'] / tr['steps']:.2f}, "
            f"{tr['tokens'] / max(1, tr['samples']):,.0f}",
        )
        t.add_row(
            "compute (forward, backward, optimizer) a step / wall a step",
            f"{tr['compute_s'] / tr['steps']:.2f} s / {wall / tr['steps']:.2f} s",
        )
    console.print(t)
    console.print(
        f"users' replies: {dict(tally.replies)}; sessions started {tally.sessions_started:,}, "
        f"done {tally.sessions_done:,}, ended at the stop {extra['ended_at_stop']}; "
        f"stand-in: {extra['standin']}; token drift: {extra['drift']:.0f}; dead letters: "
        f"{topics.get(TOPICS.dlq, (0, 0))[0]}",
        highlight=False,
    )


def plots(
    readings: list[Reading], directory: Path, title: str, every_s: float, end_s: float
) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    minutes = [r.t / 60 for r in readings]
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    for stage in STAGES:
        ax.plot(minutes, [r.lag.get(stage.name, 0) for r in readings], label=stage.name)
    ax.set_yscale("symlog", linthresh=10)
    ax.axvline(end_s / 60, color="grey", linestyle=":", label="users stop")
    ax.set_xlabel("minutes since the users started")
    ax.set_ylabel("records behind")
    ax.set_title(f"consumer lag per stage: {title}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    lag_path = directory / "scale-lag.png"
    fig.savefig(lag_path, dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    spaced = [readings[0]]  # a reading just after another (the load's end) makes a spike
    for r in readings[1:]:
        if r.t - spaced[-1].t >= every_s / 2:
            spaced.append(r)
    readings = spaced
    mids = [(a.t + b.t) / 120 for a, b in itertools.pairwise(readings)]

    def series(f: Any) -> list[float]:
        return [rate(a, b, f(b) - f(a)) for a, b in itertools.pairwise(readings)]

    ax.plot(mids, series(lambda r: r.calls), label="calls (gateway)")
    for topic, name in ((TOPICS.steps, "steps"), (TOPICS.turns, "turns")):
        ax.plot(mids, series(lambda r, topic=topic: r.ends.get(topic, 0)), label=name)
    ax.plot(mids, series(lambda r: r.ends.get(TOPICS.judgements, 0)), label="judgements")
    ax.plot(mids, series(lambda r: r.ends.get(TOPICS.samples, 0)), label="samples")
    ax.plot(mids, series(lambda r: r.trained), label="trained (trainer)")
    ax.axvline(end_s / 60, color="grey", linestyle=":", label="users stop")
    ax.set_xlabel("minutes since the users started")
    ax.set_ylabel("per second")
    ax.set_title(f"throughput per stage: {title}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=3)
    fig.tight_layout()
    tp_path = directory / "scale-throughput.png"
    fig.savefig(tp_path, dpi=110)
    plt.close(fig)
    return [lag_path, tp_path]


# --- the run ---------------------------------------------------------------------------------


async def run(
    args: argparse.Namespace, stack: Stack, standin: subprocess.Popen[bytes], console: Console
) -> None:
    direct = f"http://127.0.0.1:{args.standin_port}"
    users = Users(args, stack.gateway, direct)
    services = services_of(stack, standin)
    connector = aiohttp.TCPConnector(limit=512)
    timeout = aiohttp.ClientTimeout(total=120)
    pg = await asyncpg.connect(stack.dsn)
    guard: MemoryGuard | None = None
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        monitor = Monitor(stack, services, users, http, pg)
        await monitor.lag.start()
        try:
            db_before = int(await pg.fetchval("SELECT pg_database_size(current_database())"))
            # what each service costs with no traffic: its timers, polls and sweeps
            idle = Service.snapshot(services)
            await asyncio.sleep(args.idle_s)
            idle_cores = {k: v / args.idle_s for k, v in Service.since(services, idle).items()}
            monitor.t0 = time.monotonic()
            base = await monitor.sample()
            sampler = asyncio.create_task(monitor.run(args.sample_s))
            tasks = [asyncio.create_task(users.user(i, http)) for i in range(args.sessions)]
            load_s = args.minutes * 60
            columns = (
                TextColumn("{task.description}"),
                BarColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
            )
            last_log = 0.0
            trainer = next(s for s in services if s.name == "trainer")
            guard = MemoryGuard(args.min_free_gb, trainer, console)
            with Progress(*columns, console=console, transient=True) as progress:
                bar = progress.add_task("users", total=load_s)
                while (now := time.monotonic() - monitor.t0) < load_s:
                    r = monitor.readings[-1]
                    lag = " ".join(f"{s.name} {r.lag.get(s.name, 0)}" for s in STAGES)
                    prev = at(monitor.readings, max(0.0, r.t - 60))
                    calls_s = rate(prev, r, r.calls - prev.calls) if r is not prev else 0.0
                    status = (
                        f"{users.tally.calls:,} calls ({calls_s:.1f}/s), lag: {lag}, "
                        f"trained {r.trained:.0f}, adapters {r.adapters}"
                    )
                    progress.update(bar, completed=now, description=status)
                    if now - last_log >= 60:  # for a log that is not a terminal
                        console.log(status)
                        last_log = now
                    if guard.short(now):
                        break
                    await asyncio.sleep(1)
            users.stop.set()
            await asyncio.wait(tasks, timeout=150)
            end = await monitor.sample()
            ended = await users.end_open(http)
            drain_started = time.monotonic()
            while time.monotonic() - drain_started < args.drain_s:
                await asyncio.sleep(args.sample_s / 2)
                guard.short(time.monotonic() - monitor.t0)
                r = monitor.readings[-1]
                if r.t > end.t and all(
                    r.lag.get(s, 0) == 0 for s in ("worker", "judge", "assemble")
                ):
                    break
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            drained = await monitor.sample()
            drain_s = time.monotonic() - drain_started
            console.print(f"users stopped; drained in {drain_s:.0f} s; reading topics and tables")
            tables = await postgres_tables(pg)
            db_after = int(await pg.fetchval("SELECT pg_database_size(current_database())"))
            topics = await topic_bytes(f"127.0.0.1:{stack.ports['broker']}")
            drift = 0.0
            for url in worker_metrics_urls(stack):
                metrics = await scrape(http, url)
                drift += sum(
                    v for k, v in metrics.items() if k.startswith("claw_token_drift_total")
                )
            async with http.get(f"{direct}/stats") as resp:
                standin_stats = await resp.json()
            training = dict(
                await pg.fetchrow(
                    "SELECT count(*) AS steps, coalesce(sum(n_samples), 0) AS samples,"
                    " coalesce(sum(n_tokens), 0) AS tokens,"
                    " coalesce(sum(step_time_s), 0) AS compute_s FROM training_steps"
                )
            )
        finally:
            if guard is not None:
                guard.release()
            await monitor.lag.stop()
            await pg.close()
    readings = monitor.readings
    ramped = at(readings, args.think_s)
    steady = at(readings, min(max(60.0, 2 * args.think_s), end.t / 2))
    phases = Phases(base, ramped, steady, end, drained, drain_s)
    steps_spec = next(s for s in specs_for(TOPICS) if s.name == TOPICS.steps)
    extra = {
        "partitions": steps_spec.partitions,
        "load": ", ".join(f"{x:.1f}" for x in os.getloadavg()),
        "standin": standin_stats,
        "drift": drift,
        "ended_at_stop": ended,
        "idle_cores": idle_cores,
        "training": training,
        "memory_stop": guard.why if guard is not None else None,
    }
    report(
        console,
        args,
        users,
        readings,
        phases,
        services,
        tables,
        (db_before, db_after),
        topics,
        extra,
    )
    if args.plots is not None:
        title = (
            f"{args.sessions} sessions, {args.tenants} tenants, {args.gateways} gateway(s), "
            f"{args.workers} worker(s), {psutil.cpu_count()} cores"
        )
        for path in plots(readings, args.plots, title, args.sample_s, phases.end.t):
            console.print(f"plot: {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="How long the users talk.")
    parser.add_argument("--sessions", type=int, default=1000, help="Concurrent conversations.")
    parser.add_argument("--tenants", type=int, default=100)
    parser.add_argument("--think-s", type=float, default=30.0, help="Mean think time.")
    parser.add_argument("--turns", default="3-8", help="Turns of a conversation: LO-HI.")
    parser.add_argument("--stream-share", type=float, default=0.5)
    parser.add_argument("--system-words", type=int, default=150)
    parser.add_argument("--gateways", type=int, default=1, help="`up --gateways`")
    parser.add_argument("--workers", type=int, default=1, help="`up --workers`")
    parser.add_argument(
        "--engine-ms", type=float, default=300.0, help="The stand-in's answer time."
    )
    parser.add_argument("--judge-ms", type=float, default=100.0, help="The stand-in judge's time.")
    parser.add_argument("--model", default="smollm2-135m", help="The trainer's model.")
    parser.add_argument("--trainer-threads", type=int, default=1, help="OMP_NUM_THREADS.")
    parser.add_argument("--sample-s", type=float, default=10.0, help="Seconds between readings.")
    parser.add_argument("--probe-share", type=float, default=0.05)
    parser.add_argument("--drain-s", type=float, default=180.0)
    parser.add_argument(
        "--idle-s", type=float, default=30.0, help="CPU of the idle stack, before the users."
    )
    parser.add_argument(
        "--min-free-gb", type=float, default=4.0, help="Stop early below this much free memory."
    )
    parser.add_argument("--plots", type=Path, default=None, help="Folder for the two plots.")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    console = Console(width=150)
    args.standin_port = bench_port()
    standin_log = Path("/tmp") / f"scale-standin-{args.standin_port}.log"
    standin = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "bench" / "stub_upstream.py"),
            str(args.standin_port),
            "--conversation",
            "--engine-ms",
            str(args.engine_ms),
            "--judge-ms",
            str(args.judge_ms),
        ],
        stdout=standin_log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    engine = f"http://127.0.0.1:{args.standin_port}"
    deadline = time.monotonic() + 30
    while True:  # the stand-in answers before any service asks it
        try:
            urllib.request.urlopen(f"{engine}/health", timeout=1).close()
            break
        except OSError:
            if standin.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(
                    f"the stand-in did not start: {standin_log.read_text()[-2000:]}"
                ) from None
            time.sleep(0.2)
    stack = new_stack("scale-bench-", bench_port)
    stack.env |= {
        "CLAW_MODEL": args.model,
        "CLAW_GATEWAY__BACKENDS": json.dumps([engine]),
        "CLAW_TRAINER__ENGINES": json.dumps([engine]),
        "CLAW_WORKER__JUDGE_URL": f"{engine}/judge/v1",
        "CLAW_TENANTS__KEYS": json.dumps(
            {tenant_key(i): tenant_name(i) for i in range(args.tenants)}
        ),
        "CLAW_TENANTS__ADAPTERS": "all",
        "OMP_NUM_THREADS": str(args.trainer_threads),
    }
    try:
        up = ["--no-engine", "--gateways", str(args.gateways), "--workers", str(args.workers)]
        with running(stack, *up, console=console):
            asyncio.run(run(args, stack, standin, console))
    finally:
        standin.terminate()
        standin.wait(timeout=20)


if __name__ == "__main__":
    main()
