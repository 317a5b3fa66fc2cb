"""The trainer's side of what is served: it goes on from the serving version when a rollback
or a rejection moved serving off its lineage (`reset_target`), and gives that version again to
an engine that restarted since it was pushed. `TrainerService` holds the state these read."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
from rich.console import Console
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from claw_stream.names import adapter_name
from claw_stream.settings import Settings
from claw_stream.store import consent
from claw_stream.versions.push import push, restarted, unload_everywhere
from claw_stream.versions.serving_view import ServingView, serving_view_or_none

if TYPE_CHECKING:  # what TrainerService, which this is mixed into, holds
    from claw_stream.trainer.policy import PolicyTrainer
    from claw_stream.trainer.tenants import TenantTrainers

log = logging.getLogger(__name__)


def reset_target(head: int, lineage: set[int], view: ServingView, changed: bool) -> int | None:
    """The version a gated trainer must go on from instead of its head, if any.

    `lineage` holds the versions this trainer built since it last started from a served one
    (and that one). Its head rejected: back to the serving version. The serving version changed
    to one outside the lineage (a rollback past it, a version from elsewhere) or went back
    inside it (a rollback to an ancestor): go on from it. A promotion of a lineage version older
    than the head is the normal case (the head was trained on from it): nothing to do."""
    if view.serving == head:
        return None
    if head in view.rejected:
        return view.serving
    if changed and (view.serving not in lineage or view.served_newer):
        return view.serving
    return None


class ServingVersionFollower:
    settings: Settings
    console: Console
    trainer: PolicyTrainer
    checkpoints: Path
    engines: list[str]
    world: int
    db: async_sessionmaker[AsyncSession]
    http: httpx.AsyncClient
    lineage: set[int]
    seen_serving: int | None
    stuck_at: int | None
    engines_checked: float

    tenants: TenantTrainers | None

    async def _serving_view(self, policy: str | None = None) -> ServingView | None:
        """What weight_versions says is served (of the shared policy, or a tenant's)."""
        return await serving_view_or_none(self.db, policy or self.settings.policy_name)

    async def _follow_serving(self) -> None:
        """Go on from the serving version when the head was rejected (gated) or a rollback (or
        another trainer) moved serving off this lineage. Postgres is asked before each step."""
        if (view := await self._serving_view()) is None:
            return
        changed = self.seen_serving is not None and view.serving != self.seen_serving
        self.seen_serving = view.serving
        head = self.trainer.state.version
        target = reset_target(head, self.lineage, view, changed)
        if target is None:
            return
        if (target == 0 and view.serving_path is None) or self.world > 1:
            # the initial model has no checkpoint; other ranks would keep their weights
            if self.stuck_at != target:  # said once
                log.warning("cannot go back to v%d: training goes on from v%d", target, head)
                self.stuck_at = target
            return
        folder = Path(view.serving_path or self.checkpoints / f"v{target}")
        await asyncio.to_thread(self.trainer.go_back_to, folder, target)
        self.lineage = {target}
        self.console.print(f"serving is v{target}: training goes on from it (was v{head})")

    async def _engines_in_step(self) -> None:
        """Give the serving version again to an engine that restarted since it was pushed.

        A restarted engine serves the model it started with (v0, no adapter). Its answers'
        samples are then stale against the serving version, the worker drops them all, and
        no sample means no step and no push: training would stop until someone pushed by hand.
        Only an engine at v0 (or without the serving adapter) is pushed to: an engine newer
        than the serving version is a promotion or a rollback under way, not a restart, and it
        runs between steps, so never beside this trainer's own push."""
        every = self.settings.trainer.engine_check_s
        if not every or time.monotonic() - self.engines_checked < every:
            return
        self.engines_checked = time.monotonic()
        view = await self._serving_view()
        if view is not None and view.serving > 0:
            folder = Path(view.serving_path or self.checkpoints / f"v{view.serving}")
            lora = self.settings.trainer.lora
            adapter = adapter_name(self.settings.policy_name, view.serving) if lora else None
            await self._give_again(view.serving, folder, adapter)
        if self.tenants is not None:
            await self._forget_tenants(self.tenants)
        # tenants' adapters too: without them, a tenant is served by the shared policy
        for tenant in self.tenants.known() if self.tenants is not None else []:
            view = await self._serving_view(tenant)
            if view is not None and view.serving > 0 and view.serving_path is not None:
                adapter = adapter_name(tenant, view.serving)
                await self._give_again(view.serving, Path(view.serving_path), adapter)

    async def _give_again(self, version: int, folder: Path, adapter: str | None) -> None:
        key = self.settings.resolved_admin_key()
        for url in self.engines:
            try:
                if not await restarted(self.http, url, key, adapter):
                    continue
                log.warning(
                    "engine %s serves the model it started with: loading %s again",
                    url,
                    adapter or f"the serving v{version}",
                )
                await push(self.http, url, folder, version, key, adapter=adapter)
            except (httpx.HTTPError, RuntimeError, ValueError) as exc:  # down: asked again later
                log.warning("engine %s not given %s: %s", url, adapter or f"v{version}", exc)

    async def _forget_tenants(self, tenants: TenantTrainers) -> None:
        """Tenants someone asked to forget (`claw-stream forget --tenant`): their adapters'
        checkpoints deleted here, where they are on disk, then the mark."""
        try:
            async with self.db.begin() as session:
                conn = await session.connection()
                for tenant in await consent.forgotten_tenants(conn):
                    await asyncio.to_thread(tenants.forget, tenant)
                    # a version this trainer made while the forget ran goes too
                    await consent.forget_tenant(conn, tenant)
                    await consent.tenant_gone(conn, tenant)
                    key = self.settings.resolved_admin_key()
                    await unload_everywhere(self.http, self.engines, key, tenant)
                    self.console.print(
                        f"tenant {tenant} forgotten: its adapter's checkpoints are gone"
                    )
        except (SQLAlchemyError, OSError) as exc:  # asked again at the next check
            log.warning("cannot read the forgotten tenants: %s", exc)
