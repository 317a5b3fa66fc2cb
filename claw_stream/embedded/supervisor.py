"""`claw-stream up`: start every service in dependency order, wait for each, supervise, stop cleanly.

Each child runs in its own session (process group), so a terminal Ctrl-C reaches only the
supervisor, which then stops the services in reverse order. Children also get a parent-death
signal, so even a SIGKILLed supervisor leaves no orphan behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import IO, Any

import httpx
from rich.console import Console
from rich.table import Table

from claw_stream.bus.kafka import wait_for_broker
from claw_stream.bus.topics import apply_topics, specs_for
from claw_stream.embedded.broker import broker_command
from claw_stream.embedded.hub import is_hub_id
from claw_stream.embedded.models import REGISTRY, pull
from claw_stream.embedded.postgres import EmbeddedPostgres
from claw_stream.settings import Settings
from claw_stream.store import migrate

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent(sig: int) -> Callable[[], None]:
    def preexec() -> None:
        _libc.prctl(_PR_SET_PDEATHSIG, sig)

    return preexec


@dataclass
class Service:
    name: str
    argv: list[str]
    ready: Callable[[], Awaitable[None]]
    url: str = ""
    stop_signal: int = signal.SIGTERM
    popen_kwargs: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    on_restart: Callable[[], Awaitable[Any]] | None = None
    proc: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = None
    state: str = "pending"
    restarts: int = 0


@dataclass
class StartupTask:
    """A one-shot start-up task (topics, migrations) shown in the status table."""

    name: str
    run: Callable[[], Awaitable[str]]
    state: str = "pending"
    detail: str = ""


# The engine and the trainer share the CPU cores here, each with torch's OpenMP threads. OpenMP
# busy-waits for its threads by default: beside another busy process a parallel region waits
# on a thread that is not running. SmolLM2-135M on 2 cores, 48 tokens for 4 rows: 2.9 s alone,
# 12.3 s beside one busy core; with threads that sleep when idle, 3.6 s and 3.0 s
# (bench/cpu_sharing_bench.py). A user's own OMP_WAIT_POLICY wins.
SHARED_CPU_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}


# The engine as judge is the small policy model on the same CPUs: bounded so that a turn is
# judged in seconds. Unbounded, SmolLM2-135M took 77 s a turn on 2 cores (a 4,096-token vote
# budget and the whole OpenClaw prompt to read), its votes timed out under traffic and it
# never read a next state anyway (bench/judge_agreement_bench.py): the user's reaction,
# first by default, decides where they said what they thought.
EMBEDDED_JUDGE = {"judge_max_tokens": 48, "judge_context_tokens": 2048}


def embedded_judge_bounds(worker: Any) -> dict[str, str]:
    """The worker's environment for the engine as judge: the bounds the user left unset."""
    return {
        f"CLAW_WORKER__{name.upper()}": str(value)
        for name, value in EMBEDDED_JUDGE.items()
        if name not in worker.model_fields_set
    }


def worker_names(n: int) -> list[str]:
    """One stream worker is `worker`, as up.json, the doctor and its log have always named it;
    several are worker-1..worker-N, each with its own log, metrics port and Faust data dir."""
    return ["worker"] if n == 1 else [f"worker-{i}" for i in range(1, n + 1)]


def worker_ports(first: int, n: int, taken: set[int]) -> list[int]:
    """The metrics ports of n workers: the first where the settings put it, the others the
    next ports that no other service of the stack listens on."""
    ports, port = [first], first
    while len(ports) < n:
        port += 1
        if port not in taken:
            ports.append(port)
    return ports


def claw_command(*args: str) -> list[str]:
    """A `claw-stream` subcommand run with this interpreter (no PATH lookup needed)."""
    return [sys.executable, "-m", "claw_stream", *args]


async def wait_http(url: str, timeout_s: float) -> None:
    """Return once GET url answers 200."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    async with httpx.AsyncClient(timeout=2) as client:
        while loop.time() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(url)).status_code == 200:
                    return
            await asyncio.sleep(0.2)
    raise TimeoutError(f"{url} did not answer 200 within {timeout_s:.0f}s")


def other_ports(s: Settings) -> set[int]:
    """The ports the stack's other services listen on (workers' metrics ports avoid them)."""
    ports = (
        s.broker_port,
        s.postgres_port,
        s.engine.port,
        s.engine.port + 100,  # a candidate engine's
        s.gateway.port,
        s.trainer.metrics_port,
        s.eval.metrics_port,
    )
    return {p for p in ports if p is not None}


def worker_services(s: Settings, n: int, judge: list[str], engine: bool) -> list[Service]:
    """n stream workers of one app id, so one consumer group: each with its own name, metrics
    port, log and (several of them) Faust data dir; `judge`: the flags that name their judge."""
    w = s.worker
    ports = worker_ports(w.metrics_port or 9401, n, other_ports(s))
    services = []
    for name, port in zip(worker_names(n), ports, strict=True):
        metrics = f"http://{w.metrics_host}:{port}/metrics"
        env = embedded_judge_bounds(w) if engine else {}
        services.append(
            Service(
                name,
                claw_command("worker", "--metrics-port", str(port), *judge),
                ready=partial(wait_http, metrics, max(60.0, s.ready_timeout_s)),
                url=metrics,
                env=env | ({"CLAW_WORKER__INSTANCE": name} if n > 1 else {}),
            )
        )
    return services


def scale_summary(s: Settings, workers: int, gateway: bool) -> str:
    """How many stream workers and gateway processes run, and how many workers the partitions
    of claw.steps keep busy."""
    parts = []
    if workers:
        steps = next(t for t in specs_for(s.topics) if t.name == s.topics.steps)
        idle = max(0, workers - steps.partitions)
        parts.append(
            f"{workers} stream worker{'s' if workers > 1 else ''} in consumer group "
            f"{s.worker.app_id} ({s.topics.steps}: {steps.partitions} partitions"
            + (f"; {idle} worker{'s' if idle > 1 else ''} idle)" if idle else ")")
        )
    if gateway:
        g = s.gateway
        processes = f"{g.workers} process{'es' if g.workers > 1 else ''}"
        parts.append(f"gateway: {processes} on http://{g.host}:{g.port}")
    return "; ".join(parts)


class Supervisor:
    def __init__(self, settings: Settings, console: Console | None = None):
        self.settings = settings
        self.console = console or Console()
        self.units: list[Service | StartupTask] = []  # started / run in this order
        self.workers = 0  # stream-worker processes planned (one consumer group)
        self._stop = asyncio.Event()
        self.postgres = EmbeddedPostgres(
            settings.postgres_dir,
            settings.postgres_host,
            settings.postgres_port,
            settings.postgres_user,
            settings.postgres_db,
        )

    # -- plan ------------------------------------------------------------------------------

    @property
    def services(self) -> list[Service]:
        return [u for u in self.units if isinstance(u, Service)]

    def plan(
        self,
        *,
        embedded_broker: bool = True,
        embedded_postgres: bool = True,
        engine: bool = True,
        gateway: bool = True,
        trainer: bool = True,
        worker: bool = True,
        workers: int = 1,
    ) -> None:
        """The services to start, in order; `workers` stream workers share the partitions of
        one consumer group, the gateway runs `gateway.workers` processes on its one port."""
        s = self.settings
        if embedded_broker:
            s.kafka_bootstrap = f"{s.broker_host}:{s.broker_port}"
            self.units.append(
                Service(
                    "broker",
                    broker_command(s.broker_host, s.broker_port),
                    ready=lambda: wait_for_broker(s.kafka_bootstrap, s.ready_timeout_s),
                    url=f"kafka://{s.kafka_bootstrap}",
                    on_restart=self._apply_topics,  # memory storage: a new broker has no topics
                )
            )
        if embedded_postgres:
            s.database_url = self.postgres.url
            self.units.append(
                Service(
                    "postgres",
                    self.postgres.command(),
                    ready=self._postgres_ready,
                    url=self.postgres.dsn(),
                    stop_signal=signal.SIGINT,  # "fast" shutdown: abort clients, checkpoint
                    popen_kwargs=self.postgres.popen_kwargs(),
                )
            )
        self.units += [
            StartupTask("topics", self._apply_topics),
            StartupTask("migrations", self._migrate),
        ]
        if engine:
            e = s.engine
            base = f"http://{e.host}:{e.port}"
            self.units.append(
                Service(
                    "engine",
                    claw_command(
                        "engine", "--model", s.model, "--host", e.host, "--port", str(e.port)
                    ),
                    ready=lambda: wait_http(base + "/health", max(120.0, s.ready_timeout_s)),
                    url=base + "/v1",
                )
            )
            s.gateway.backends = [base]
        gated = s.serving.policy == "gated"
        if engine and gated and not s.serving.candidate_engines:
            # candidates are loaded and evaluated here, never where the policy is served
            port = e.port + 100  # `versions.push.candidate_engines`' default
            candidate = f"http://{e.host}:{port}"
            self.units.append(
                Service(
                    "candidate-engine",
                    claw_command(
                        "engine", "--model", s.model, "--host", e.host, "--port", str(port)
                    ),
                    ready=lambda: wait_http(candidate + "/health", max(120.0, s.ready_timeout_s)),
                    url=candidate + "/v1",
                )
            )
        if trainer:
            t = s.trainer
            metrics = f"http://{t.metrics_host}:{t.metrics_port}/metrics"
            self.units.append(
                Service(
                    "trainer",
                    claw_command("trainer", "--model", s.model),
                    ready=lambda: wait_http(metrics, max(180.0, s.ready_timeout_s)),
                    url=metrics,
                )
            )
        judge = ["--judge-url", f"http://{s.engine.host}:{s.engine.port}/v1"] if engine else []
        if worker:
            self.workers = workers
            self.units += worker_services(s, workers, judge, engine)
        if gateway:
            g = s.gateway
            front = f"http://{g.host}:{g.port}"
            self.units.append(
                Service(
                    "gateway",
                    claw_command(
                        "gateway",
                        "--host",
                        g.host,
                        "--port",
                        str(g.port),
                        "--backends",
                        ",".join(g.backends),
                        "--workers",  # processes behind the one port
                        str(g.workers),
                    ),
                    ready=lambda: wait_http(front + "/healthz", s.ready_timeout_s),
                    url=front + "/v1",
                )
            )
        # gated: the evaluator is the promoter, nothing is served without it
        if gateway and (s.eval.on_ready or gated) and s.eval.metrics_port is not None:
            ev = s.eval
            eval_metrics = f"http://{ev.metrics_host}:{ev.metrics_port}/metrics"
            self.units.append(
                Service(
                    "evaluator",
                    # the replay's judge, where none is set: the worker's, the embedded engine
                    claw_command("eval", "--follow", *(judge if ev.judge_url is None else [])),
                    ready=lambda: wait_http(eval_metrics, s.ready_timeout_s),
                    url=eval_metrics,
                )
            )

    async def _postgres_ready(self) -> None:
        await self.postgres.wait_ready(self.settings.ready_timeout_s)
        await self.postgres.ensure_database()

    async def _apply_topics(self) -> str:
        reports = await apply_topics(self.settings.kafka_bootstrap, specs_for(self.settings.topics))
        created = sum(r.action == "created" for r in reports)
        drift = [f"{r.topic}: {', '.join(r.drift)}" for r in reports if r.drift]
        return f"{len(reports)} topics, {created} created" + (
            f"; drift: {'; '.join(drift)}" if drift else ""
        )

    def prepare(self) -> None:
        """Work before anything starts that may take long and shows its own progress."""
        model = self.settings.model
        if any(s.name == "engine" for s in self.services) and (
            model in REGISTRY or is_hub_id(model)
        ):
            pull(self.settings.model, self.settings.models_dir, self.console)
        if any(s.name == "postgres" for s in self.services):
            self.postgres.ensure_initialised()

    async def _migrate(self) -> str:
        await migrate.upgrade(self.settings.database_url)
        return f"at {await migrate.current(self.settings.database_url)}"

    # -- processes ---------------------------------------------------------------------------

    def _spawn(self, service: Service) -> None:
        logs = self.settings.logs_dir
        logs.mkdir(parents=True, exist_ok=True)
        service.log = (logs / f"{service.name}.log").open("ab")
        stamp = datetime.now(UTC).isoformat()
        service.log.write(f"\n=== {stamp} starting {' '.join(service.argv)}\n".encode())
        service.log.flush()
        env = {**SHARED_CPU_ENV, **os.environ, **self._child_env(), **service.env}
        service.proc = subprocess.Popen(
            service.argv,
            stdout=service.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent(service.stop_signal),
            **service.popen_kwargs,
        )
        service.state = "starting"

    def _child_env(self) -> dict[str, str]:
        s = self.settings
        return {
            "CLAW_DATA_DIR": str(s.data_dir),
            "CLAW_KAFKA_BOOTSTRAP": s.kafka_bootstrap,
            "CLAW_DATABASE_URL": s.database_url,
            "CLAW_ADMIN_KEY": s.resolved_admin_key(),
            "CLAW_MODELS_DIR": str(s.models_dir),
        }

    async def _start(self, service: Service) -> None:
        self._spawn(service)
        ready = asyncio.ensure_future(service.ready())
        died = asyncio.ensure_future(self._wait_exit(service))
        done, _ = await asyncio.wait({ready, died}, return_when=asyncio.FIRST_COMPLETED)
        if ready in done:
            died.cancel()
            ready.result()
            service.state = "ready"
            return
        ready.cancel()
        raise RuntimeError(
            f"{service.name} exited with code {service.proc.returncode if service.proc else '?'} "
            f"before it was ready; see {self.settings.logs_dir / (service.name + '.log')}"
        )

    @staticmethod
    async def _wait_exit(service: Service) -> int:
        assert service.proc is not None
        while service.proc.poll() is None:
            await asyncio.sleep(0.1)
        return service.proc.returncode

    def _signal_group(self, service: Service, sig: int) -> None:
        if service.proc is None or service.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(service.proc.pid, sig)

    async def stop_all(self, timeout_s: float = 20.0) -> None:
        for service in reversed(self.services):
            if service.proc is None:
                continue
            if service.proc.poll() is None:
                service.state = "stopping"
                self._signal_group(service, service.stop_signal)
                deadline = time.monotonic() + timeout_s
                while service.proc.poll() is None and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                if service.proc.poll() is None:
                    self._signal_group(service, signal.SIGKILL)
                    service.proc.wait()
            # the group may still hold grandchildren after the leader exited
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(service.proc.pid, signal.SIGKILL)
            service.state = "stopped"
            if service.log:
                service.log.close()
        with contextlib.suppress(FileNotFoundError):
            (self.settings.run_dir / "up.json").unlink()

    # -- status ------------------------------------------------------------------------------

    def status_table(self) -> Table:
        table = Table(title="claw-stream", title_justify="left")
        for column in ("service", "state", "pid", "address", "log"):
            table.add_column(column, overflow="fold")
        for unit in self.units:
            if isinstance(unit, StartupTask):
                table.add_row(unit.name, unit.state, "", unit.detail, "")
                continue
            table.add_row(
                unit.name,
                unit.state,
                str(unit.proc.pid) if unit.proc else "",
                unit.url,
                str(self.settings.logs_dir / f"{unit.name}.log"),
            )
        return table

    def _write_run_file(self) -> None:
        self.settings.run_dir.mkdir(parents=True, exist_ok=True)
        info = {
            "pid": os.getpid(),
            "services": {
                s.name: {"pid": s.proc.pid if s.proc else None, "url": s.url} for s in self.services
            },
            "kafka_bootstrap": self.settings.kafka_bootstrap,
            "database_url": self.settings.database_url,
        }
        path = self.settings.run_dir / "up.json"
        path.write_text(json.dumps(info, indent=2) + "\n")

    # -- main ---------------------------------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._stop.set)
        try:
            await asyncio.to_thread(self.prepare)
            started = time.monotonic()
            for unit in self.units:
                if self._stop.is_set():
                    return 130
                with self.console.status(f"{unit.name}…"):
                    if isinstance(unit, StartupTask):
                        unit.detail = await unit.run()
                        unit.state = "done"
                        if unit.name == "migrations":
                            self.console.print(
                                f"broker, Postgres, topics and migrations ready in "
                                f"{time.monotonic() - started:.1f}s"
                            )
                    else:
                        await self._start(unit)
            self._write_run_file()
            self.console.print(self.status_table())
            gateway = any(u.name == "gateway" for u in self.services)
            if summary := scale_summary(self.settings, self.workers, gateway):
                self.console.print(summary, markup=False, highlight=False)
            self.console.print(f"admin key: [bold]{self.settings.resolved_admin_key()}[/bold]")
            if any(s.name == "gateway" for s in self.services):
                await self._print_quickstart()
            self.console.print(
                f"[green]ready[/green] in {time.monotonic() - started:.1f}s — logs in "
                f"{self.settings.logs_dir}; Ctrl-C stops everything"
            )
            return await self._supervise()
        except Exception as exc:
            self.console.print(f"[red]claw-stream up failed:[/red] {exc}")
            return 1
        finally:
            with self.console.status("stopping…"):
                await self.stop_all()
            self.console.print("stopped")

    async def _print_quickstart(self) -> None:
        """A session key from the gateway and snippets that use it, ready to paste."""
        g = self.settings.gateway
        front = f"http://{g.host}:{g.port}"
        async with httpx.AsyncClient(timeout=10) as http:
            r = await http.post(
                f"{front}/rl/start_session",
                headers={"Authorization": f"Bearer {self.settings.resolved_admin_key()}"},
                json={},
            )
            r.raise_for_status()
            key = r.json()["api_key"]
            bearer = {"Authorization": f"Bearer {key}"}  # a gateway with a client key asks one
            listed = await http.get(f"{front}/v1/models", headers=bearer)
        # an engine not answering yet (`up --no-engine`) lists nothing: the snippets name
        # the configured model (its `data` was read blindly, and `up` failed with 'data')
        models = listed.json().get("data") if listed.status_code == 200 else None
        model = models[0]["id"] if models else self.settings.model
        self.console.print(
            f"base URL: {front}/v1   session key: {key}\n\n"
            f"curl {front}/v1/chat/completions -H 'Authorization: Bearer {key}' \\\n"
            f"  -H 'content-type: application/json' \\\n"
            f'  -d \'{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello!"}}]}}\'\n\n'
            f"from openai import OpenAI\n"
            f'client = OpenAI(base_url="{front}/v1", api_key="{key}")\n'
            f'print(client.chat.completions.create(model="{model}", '
            f'messages=[{{"role": "user", "content": "Hello!"}}]).choices[0].message.content)\n\n'
            f"feedback: curl -X POST {front}/rl/feedback -H 'Authorization: Bearer {key}' "
            f"-H 'content-type: application/json' -d '{{\"score\": 1}}'\n\n"
            "an agent: claw-stream connect openclaw   (or claude-code, codex, gemini, opencode, aider, "
            "hermes, zeroclaw)"
            + (
                f"\n\nconsole: {front}/console/login?key={self.settings.resolved_admin_key()}"
                if self.settings.console.enabled
                else ""
            ),
            markup=False,
            highlight=False,
            soft_wrap=True,
        )

    async def _supervise(self) -> int:
        """Restart a service that died, with backoff; return when asked to stop."""
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=0.5)
            for service in self.services:
                if self._stop.is_set() or service.proc is None or service.proc.poll() is None:
                    continue
                service.state = f"exited {service.proc.returncode}"
                self.console.print(
                    f"[yellow]{service.name} exited with code {service.proc.returncode}; restarting "
                    f"(see {self.settings.logs_dir / (service.name + '.log')})[/yellow]"
                )
                if service.log:
                    service.log.close()
                await asyncio.sleep(min(30.0, 2.0**service.restarts))
                service.restarts += 1
                try:
                    await self._start(service)
                    if service.on_restart is not None:
                        await service.on_restart()
                except Exception as exc:
                    self.console.print(f"[red]{service.name} failed to restart: {exc}[/red]")
                else:
                    self._write_run_file()
        return 0
