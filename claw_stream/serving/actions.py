"""Where versions are served (serving and candidate engines, the checkpoint directory) and
`claw-stream rollback`; pushing, recording and announcing a version live in `weights.py`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import httpx

from claw_stream.events import WeightEvent
from claw_stream.serving import records
from claw_stream.settings import Settings
from claw_stream.store.db import make_engine
from claw_stream.weights import ServingError, announce, push


def serving_engines(settings: Settings) -> list[str]:
    return settings.trainer.engines or [f"http://{settings.engine.host}:{settings.engine.port}"]


def checkpoint_dir(settings: Settings) -> Path:
    return settings.trainer.checkpoint_dir or settings.data_dir / "checkpoints"


def candidate_engines(settings: Settings) -> list[str]:
    return settings.serving.candidate_engines or [
        f"http://{settings.engine.host}:{settings.engine.port + 100}"
    ]


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


async def rollback(settings: Settings, version: int, reason: str) -> Rollback:
    """Serve checkpoint `v{version}` on every serving engine and announce it ready, with why."""
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
            reason=reason,
        ),
    )
    return Rollback(version, view.serving, folder, engines)
