"""`claw-stream rollback` (and the watchdog's, and the console's button): an older version
served again on every serving engine and announced ready, with why."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import httpx

from claw_stream.events import WeightEvent
from claw_stream.names import adapter_name
from claw_stream.settings import Settings
from claw_stream.store.db import make_engine
from claw_stream.versions import ServingError, records
from claw_stream.versions.announce import announce
from claw_stream.versions.checkpoints import checkpoint_dir, checkpoint_folder
from claw_stream.versions.push import push, restarted, serving_engines, unload_everywhere
from claw_stream.versions.serving_view import ServingView, serving_view


@dataclass(frozen=True)
class Rollback:
    version: int
    previous: int
    folder: Path
    engines: list[str]


async def _recorded(
    settings: Settings, policy: str, version: int
) -> tuple[ServingView, str | None]:
    """What is served of `policy`, and where version's checkpoint was recorded."""
    db = make_engine(settings.database_url)
    try:
        async with db.connect() as conn:
            view = await serving_view(conn, policy)
            return view, await records.checkpoint_of(conn, policy, version)
    finally:
        await db.dispose()


async def rollback(settings: Settings, version: int, reason: str) -> Rollback:
    """Serve checkpoint `v{version}` on every serving engine and announce it ready, with why."""
    policy = settings.policy_name
    view, recorded = await _recorded(settings, policy, version)
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


async def rollback_tenant(settings: Settings, tenant: str, version: int, reason: str) -> Rollback:
    """Serve `tenant@v{version}` again: loaded on every serving engine where it is not, every
    newer adapter of the tenant unloaded (gateways serve a tenant the newest its engines list),
    announced ready with why; the trainer goes on from it at the tenant's next step."""
    view, recorded = await _recorded(settings, tenant, version)
    folder = (
        Path(recorded)
        if recorded
        else checkpoint_dir(settings) / "tenants" / tenant / f"v{version}"
    )
    if not (folder / "adapter_config.json").is_file():
        raise ServingError(
            f"no adapter checkpoint of {tenant} v{version} (looked in {folder}): it was never "
            "saved, was pruned (trainer.keep_checkpoints) or the tenant was forgotten"
        )
    adapter = adapter_name(tenant, version)
    engines = serving_engines(settings)
    key = settings.resolved_admin_key()
    async with httpx.AsyncClient(timeout=600) as http:
        for url in engines:
            if await restarted(http, url, key, adapter):  # the engine lacks it: loaded again
                await push(http, url, folder, version, key, adapter=adapter)
        # gateways serve a tenant the newest adapter its engines list: the newer ones must go
        await unload_everywhere(http, engines, key, tenant, above=version, skip_down=False)
    await announce(
        settings,
        WeightEvent(
            policy=tenant,
            version=version,
            status="ready",
            kind="lora",
            checkpoint_path=str(folder),
            adapter_name=adapter,
            rolled_back_from=view.serving,
            reason=reason,
        ),
    )
    return Rollback(version, view.serving, folder, engines)
