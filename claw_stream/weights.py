"""A weight version's one home: pushed to engines (full weights or a LoRA adapter), recorded in
weight_versions by one upsert with one rule, announced on claw.weights. The trainer, the
promoter, `claw-stream rollback` and the worker archiving claw.weights all go through here."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from sqlalchemy import func, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from claw_stream.bus.kafka import make_producer, publish
from claw_stream.events import WeightEvent
from claw_stream.names import adapter_policy, adapter_version
from claw_stream.store import models as m
from claw_stream.store.db import make_engine

if TYPE_CHECKING:
    from claw_stream.settings import Settings

log = logging.getLogger(__name__)

# a candidate's announcement is stamped as an update's, a rejection as a failure's (no column
# of their own); the newest ready_at is the serving version (a rollback stamps it again)
WEIGHT_STAMPS = {
    "updating": "updating_at",
    "candidate": "updating_at",
    "ready": "ready_at",
    "failed": "failed_at",
    "rejected": "failed_at",
}


class ServingError(RuntimeError):
    """A version cannot be served; the message says which and why."""


async def record(conn: AsyncConnection, event: WeightEvent) -> None:
    """The version's row as this event leaves it: a field the event leaves out keeps its value,
    and a late 'updating' or 'candidate' never overwrites a decision (the worker archives
    every event again, in topic order, after its writer recorded it)."""
    stamp = WEIGHT_STAMPS[event.status]
    values = {
        "status": event.status,
        "kind": event.kind,
        "checkpoint_path": event.checkpoint_path,
        "adapter_name": event.adapter_name,
        "trainer_step": event.trainer_step,
        "error": event.error,
        "rolled_back_from": event.rolled_back_from,
        "reason": event.reason,
        stamp: event.created_at,
    }
    statement = insert(m.WeightVersion).values(policy=event.policy, version=event.version, **values)
    table = m.WeightVersion.__table__
    set_: dict[str, Any] = {
        k: func.coalesce(statement.excluded[k], table.c[k]) for k in values if k != "status"
    }
    set_["status"] = (
        text(
            "CASE WHEN weight_versions.status IN ('ready', 'failed', 'rejected')"
            " THEN weight_versions.status ELSE excluded.status END"
        )
        if event.status in ("updating", "candidate")
        else statement.excluded.status
    )
    await conn.execute(
        statement.on_conflict_do_update(index_elements=["policy", "version"], set_=set_)
    )


async def push(
    http: httpx.AsyncClient,
    url: str,
    folder: Path,
    version: int,
    admin_key: str,
    *,
    adapter: str | None = None,
    previous_adapter: str | None = None,
    rollback: bool = False,
) -> None:
    """Load checkpoint `folder` on the engine at `url`: its full weights, or as LoRA adapter
    `adapter` (then `previous_adapter` is unloaded: it is no longer served)."""
    headers = {"Authorization": f"Bearer {admin_key}"}
    root = url.rstrip("/")
    if adapter is None:
        r = await http.post(
            f"{root}/admin/load_weights",
            json={"path": str(folder), "version": version, "rollback": rollback},
            headers=headers,
        )
    else:
        r = await http.post(
            f"{root}/v1/load_lora_adapter",
            json={"lora_name": adapter, "lora_path": str(folder)},
            headers=headers,
        )
    if r.status_code != 200:
        raise ServingError(f"{url} refused version {version}: {r.status_code} {r.text[:500]}")
    if adapter is not None and previous_adapter is not None:
        await unload_adapter(http, url, admin_key, previous_adapter)


async def unload_adapter(http: httpx.AsyncClient, url: str, admin_key: str, name: str) -> bool:
    """Adapter `name` unloaded from the engine at `url`; False where it did not hold it."""
    r = await http.post(
        f"{url.rstrip('/')}/v1/unload_lora_adapter",
        json={"lora_name": name},
        headers={"Authorization": f"Bearer {admin_key}"},
    )
    return r.status_code == 200


async def unload_everywhere(
    http: httpx.AsyncClient,
    urls: list[str],
    admin_key: str,
    policy: str,
    above: int = 0,
    *,
    skip_down: bool = True,
) -> int:
    """Every `policy@vN` with N > `above` that the engines at `urls` hold, unloaded. An engine
    that does not answer is logged and skipped (it restarted without them, or is asked again),
    or with `skip_down=False` the error is raised. Returns how many were unloaded."""
    headers = {"Authorization": f"Bearer {admin_key}"}
    unloaded = 0
    for url in urls:
        root = url.rstrip("/")
        try:
            cards = (await http.get(f"{root}/v1/models", headers=headers, timeout=10)).json()
            for card in cards.get("data") or []:
                name = card.get("id")
                if adapter_policy(name) == policy and (adapter_version(name) or 0) > above:
                    unloaded += await unload_adapter(http, url, admin_key, name)
        except (httpx.HTTPError, ValueError) as exc:
            if not skip_down:
                raise
            log.warning("%s's adapters stay on %s: %s", policy, url, exc)
    return unloaded


async def restarted(http: httpx.AsyncClient, url: str, admin_key: str, adapter: str | None) -> bool:
    """Whether the engine at `url` lacks the serving adapter, or serves base weights v0: it
    restarted since the serving version was pushed to it."""
    r = await http.get(
        f"{url.rstrip('/')}/v1/models", headers={"Authorization": f"Bearer {admin_key}"}, timeout=5
    )
    r.raise_for_status()
    cards = r.json().get("data") or []
    if adapter is not None:
        return adapter not in {card.get("id") for card in cards}
    base = [c for c in cards if not c.get("parent")]
    # vLLM's cards carry no weight_version: its full weights are not checked
    return bool(base) and base[0].get("weight_version") == 0


async def announce(settings: Settings, event: WeightEvent) -> None:
    """Record the event in weight_versions (so whoever reads Postgres sees the decision without
    waiting for a worker), then publish it."""
    engine = make_engine(settings.database_url)
    try:
        async with engine.begin() as conn:
            await record(conn, event)
    finally:
        await engine.dispose()
    producer = make_producer(settings.kafka_bootstrap)
    await producer.start()
    try:
        await publish(producer, settings.topics.weights, event.policy, event)
    finally:
        await producer.stop()
