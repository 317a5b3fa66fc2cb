"""A version pushed to the engines that serve it: its full weights, or a LoRA adapter (the
adapters of a policy unloaded again); which engines those are, and whether one restarted
since the serving version was pushed to it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from claw_stream.names import adapter_policy, adapter_version
from claw_stream.versions import ServingError

if TYPE_CHECKING:
    from claw_stream.settings import Settings

log = logging.getLogger(__name__)


def serving_engines(settings: Settings) -> list[str]:
    return settings.trainer.engines or [f"http://{settings.engine.host}:{settings.engine.port}"]


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


async def load_adapter_once(
    http: httpx.AsyncClient, url: str, folder: Path, version: int, admin_key: str, adapter: str
) -> None:
    """Adapter `adapter` on the engine at `url`, loaded from `folder` unless it holds it (a
    candidate the trainer loaded there, a promotion decided again)."""
    r = await http.get(
        f"{url.rstrip('/')}/v1/models", headers={"Authorization": f"Bearer {admin_key}"}
    )
    r.raise_for_status()
    if adapter not in {card.get("id") for card in r.json().get("data") or []}:
        await push(http, url, folder, version, admin_key, adapter=adapter)


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
