"""Serving a version: push a checkpoint to engines, announce it on claw.weights and record it in
weight_versions (so a trainer reading Postgres sees the decision without waiting for a worker);
`claw-stream rollback`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import httpx

from claw_stream.bus.kafka import make_producer, publish
from claw_stream.events import WeightEvent
from claw_stream.serving import records
from claw_stream.settings import Settings
from claw_stream.store.db import make_engine
from claw_stream.store.weights import archive_weight


class ServingError(RuntimeError):
    """A version cannot be served; the message says which and why."""


def serving_engines(settings: Settings) -> list[str]:
    return settings.trainer.engines or [f"http://{settings.engine.host}:{settings.engine.port}"]


def checkpoint_dir(settings: Settings) -> Path:
    return settings.trainer.checkpoint_dir or settings.data_dir / "checkpoints"


def candidate_engines(settings: Settings) -> list[str]:
    return settings.serving.candidate_engines or [
        f"http://{settings.engine.host}:{settings.engine.port + 100}"
    ]


async def push(
    http: httpx.AsyncClient,
    url: str,
    folder: Path,
    version: int,
    admin_key: str,
    *,
    rollback: bool = False,
) -> None:
    r = await http.post(
        f"{url.rstrip('/')}/admin/load_weights",
        json={"path": str(folder), "version": version, "rollback": rollback},
        headers={"Authorization": f"Bearer {admin_key}"},
    )
    if r.status_code != 200:
        raise ServingError(f"{url} refused version {version}: {r.status_code} {r.text[:500]}")


async def announce(settings: Settings, event: WeightEvent) -> None:
    """Record the event in weight_versions, then publish it (the worker archives it again, the
    same way)."""
    engine = make_engine(settings.database_url)
    try:
        async with engine.begin() as conn:
            await archive_weight(conn, event)
    finally:
        await engine.dispose()
    producer = make_producer(settings.kafka_bootstrap)
    await producer.start()
    try:
        await publish(producer, settings.topics.weights, event.policy, event)
    finally:
        await producer.stop()


@dataclass(frozen=True)
class Rollback:
    version: int
    previous: int
    folder: Path
    engines: list[str]


def checkpoint_folder(settings: Settings, recorded: str | None, version: int) -> Path:
    """Checkpoint `v{version}`: where weight_versions says, else in the checkpoint directory."""
    base = checkpoint_dir(settings)
    for folder in (Path(recorded) if recorded else None, base / f"v{version}"):
        if folder is not None and any(folder.glob("*.safetensors")):
            return folder
    raise ServingError(
        f"no checkpoint of version {version} (looked in {recorded or base / f'v{version}'}): "
        f"it was never saved or was pruned (trainer.keep_checkpoints)"
    )


async def rollback(settings: Settings, version: int) -> Rollback:
    """Serve checkpoint `v{version}` on every serving engine and announce it ready."""
    policy = settings.policy_name
    db = make_engine(settings.database_url)
    try:
        async with db.connect() as conn:
            view = await records.serving_view(conn, policy)
            recorded = await records.checkpoint_of(conn, policy, version)
    finally:
        await db.dispose()
    folder = checkpoint_folder(settings, recorded, version)
    if settings.trainer.lora:
        raise ServingError("rollback serves full weights; a LoRA policy is not supported yet")
    engines = serving_engines(settings)
    async with httpx.AsyncClient(timeout=600) as http:
        for url in engines:
            await push(http, url, folder, version, settings.resolved_admin_key(), rollback=True)
    await announce(
        settings,
        WeightEvent(
            policy=policy,
            version=version,
            status="ready",
            checkpoint_path=str(folder),
            rolled_back_from=view.serving,
        ),
    )
    return Rollback(version, view.serving, folder, engines)
