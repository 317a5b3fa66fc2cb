"""Personal adapters: each tenant's own LoRA adapter over the base model, trained on that
tenant's samples only and published as `tenant@vN` (claw_stream/tenants.py says who gets one).

A tenant's samples never share a step with another's: every adapter sits on one base model in
memory (`shared_base.py`), each with its own optimizer and its checkpoints under
`checkpoints/tenants/<tenant>/vN`. Every step is published:
checkpoint -> `updating` -> loaded on every engine -> `ready`, recorded in weight_versions under
the tenant's name, so the gateways serve it once they list it. The adapter two versions back is
unloaded: the one before stays loaded while gateways may still name it.

Where the trainer resumes: each checkpoint keeps the ids it trained (`seen`), and after a pass
in which every sample trained is in a checkpoint, `position.json` keeps the offsets read so
far; a restarted trainer seeks to the newer of it and the shared checkpoint's offsets, and
skips what any checkpoint trained.

Under `serving.policy: gated` a tenant's step is a candidate instead: loaded on the candidate
engines and recorded, served once the promoter (`eval --follow`) promotes it; after a rejection
the adapter goes on from the version served (a new adapter where none was promoted yet).
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Literal

import httpx
from rich.console import Console
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from claw_stream.events import Sample, WeightEvent
from claw_stream.names import adapter_name
from claw_stream.settings import Settings
from claw_stream.trainer.policy import StepMetrics, TrainerState, latest_checkpoint
from claw_stream.trainer.shared_base import AdapterTrainer, SharedBase
from claw_stream.trainer.step_records import record_step
from claw_stream.versions.checkpoints import checkpoint_dir
from claw_stream.versions.numbering import next_free_version
from claw_stream.versions.push import candidate_engines, push, serving_engines, unload_adapter
from claw_stream.versions.serving_view import serving_view_or_none

log = logging.getLogger(__name__)
POSITION_FILE = "position.json"
SEEN_KEPT = 10_000  # ids a checkpoint keeps, as the shared policy's


def load_position(directory: Path) -> dict[str, int]:
    path = directory / POSITION_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def save_position(directory: Path, offsets: dict[str, int]) -> None:
    """Atomically: a crash leaves the old position or the new one."""
    directory.mkdir(parents=True, exist_ok=True)
    staging = directory / f".{POSITION_FILE}.tmp"
    staging.write_text(json.dumps(offsets))
    staging.replace(directory / POSITION_FILE)


def newest(*offsets: dict[str, int] | None) -> dict[str, int]:
    """Per partition, the furthest of several safe places to resume from."""
    out: dict[str, int] = {}
    for each in offsets:
        for key, offset in (each or {}).items():
            out[key] = max(out.get(key, 0), offset)
    return out


class TenantTrainers:
    def __init__(self, settings: Settings, model_path: Path, console: Console):
        self.settings = settings
        self.rules = settings.tenants
        self.model_path = model_path
        self.console = console
        t = settings.tenants
        self.config = settings.trainer.model_copy(
            update={
                "lora": True,
                "lora_r": t.lora_r,
                "lora_alpha": t.lora_alpha,
                "init_from": None,
                "lr": t.lr or settings.trainer.lr,
            }
        )
        self.root = checkpoint_dir(settings) / "tenants"
        self.base: SharedBase | None = None  # loaded with the first tenant's adapter
        self.trainers: dict[str, AdapterTrainer] = {}
        self.seen: dict[str, list[str]] = {}  # sample ids each adapter trained, newest last
        self.counted: Counter[str] = Counter()  # samples seen per tenant (adapter_min_samples)
        self.serving: dict[str, int] = {}  # the version each tenant's adapter serves
        # versions replaced, with when: unloaded once no gateway can route to them (_retired)
        self.replaced: dict[str, list[tuple[int, float]]] = {}
        self.retire_after_s = max(30.0, 3 * settings.gateway.health_interval_s)
        self.gated = settings.serving.policy == "gated"
        for folder in self.root.glob("*"):
            newest_checkpoint = latest_checkpoint(folder)
            if newest_checkpoint is not None:
                self.seen[folder.name] = TrainerState.load(newest_checkpoint).seen or []

    def known(self) -> list[str]:
        """Tenants with an adapter trained here (now or before a restart)."""
        return sorted(set(self.seen) | set(self.trainers))

    def forget(self, tenant: str) -> None:
        """Its adapter gone: checkpoints off the disk, the trainer out of memory; a sample of
        the tenant that comes later starts a new adapter."""
        shutil.rmtree(self.root / tenant, ignore_errors=True)
        if self.trainers.pop(tenant, None) is not None and self.base is not None:
            self.base.remove(tenant)
        self.seen.pop(tenant, None)
        self.counted.pop(tenant, None)
        self.serving.pop(tenant, None)
        self.replaced.pop(tenant, None)

    def trained_ids(self) -> list[str]:
        """Every sample id a tenant's checkpoint holds as trained."""
        return [sample_id for ids in self.seen.values() for sample_id in ids]

    def split(self, batch: list[Sample]) -> tuple[list[Sample], dict[str, list[Sample]]]:
        """The shared policy's samples, and each tenant's that trains an adapter of its own."""
        shared: list[Sample] = []
        own: dict[str, list[Sample]] = {}
        for sample in batch:
            tenant = sample.tenant
            if tenant is None or not self.rules.has_adapter(tenant):
                shared.append(sample)
                continue
            self.counted[tenant] += 1
            started = tenant in self.seen or tenant in self.trainers
            if started or self.counted[tenant] > self.rules.adapter_min_samples:
                own.setdefault(tenant, []).append(sample)
            else:
                shared.append(sample)
        return shared, own

    def _shared(self) -> SharedBase:
        if self.base is None:
            self.base = SharedBase(self.model_path, self.config)
        return self.base

    def _trainer(self, tenant: str) -> AdapterTrainer:
        if tenant not in self.trainers:
            resume = latest_checkpoint(self.root / tenant)
            self.trainers[tenant] = AdapterTrainer(self._shared(), tenant, resume=resume)
            self.seen.setdefault(tenant, [])
            self.console.print(
                f"tenant {tenant}: its own adapter (rank {self.config.lora_r})"
                + (f", resumed from {resume}" if resume else ", new")
            )
        return self.trainers[tenant]

    async def train(
        self,
        tenant: str,
        samples: list[Sample],
        offsets: dict[str, int],
        http: httpx.AsyncClient,
        db: async_sessionmaker[AsyncSession],
        announce: Callable[[str, WeightEvent], Awaitable[None]],
        keep: Callable[[WeightEvent], Awaitable[None]],
    ) -> tuple[int, StepMetrics]:
        """One step of `tenant`'s adapter on its samples, checkpointed and served as
        `tenant@vN`; `announce` publishes a weight event on claw.weights, `keep` records it
        in weight_versions (the trainer's own ways, which wait out an outage)."""
        trainer = await self._following_serving(tenant, self._trainer(tenant), db)
        metrics = await asyncio.to_thread(trainer.train_step, samples)
        seen = self.seen[tenant]
        seen.extend(str(s.sample_id) for s in samples)
        del seen[:-SEEN_KEPT]
        version = await next_free_version(db, tenant, self.root / tenant, trainer.state.version)
        directory = self.root / tenant
        folder = await asyncio.to_thread(trainer.save, directory, version, offsets, seen)
        adapter = adapter_name(tenant, version)

        def event(
            status: Literal["updating", "ready", "failed", "candidate"], error: str | None = None
        ) -> WeightEvent:
            return WeightEvent(
                policy=tenant,
                version=version,
                status=status,
                kind="lora",
                checkpoint_path=str(folder),
                adapter_name=adapter,
                trainer_step=trainer.state.step,
                error=error,
            )

        async def tell(e: WeightEvent) -> None:
            await announce(tenant, e)
            await keep(e)

        key = self.settings.resolved_admin_key()
        # gated: loaded on the candidate engines, served once the promoter says so
        engines = candidate_engines(self.settings) if self.gated else serving_engines(self.settings)
        if not self.gated:
            await tell(event("updating"))
        try:
            await asyncio.gather(
                *(push(http, url, folder, version, key, adapter=adapter) for url in engines)
            )
        except Exception as exc:
            await tell(event("failed", str(exc)[:2000]))
            raise
        if self.gated:  # recorded first: the promoter only decides recorded candidates
            await keep(event("candidate"))
            await announce(tenant, event("candidate"))
        else:
            await tell(event("ready"))
        for old in [] if self.gated else self._retired(tenant, version):
            try:
                await asyncio.gather(
                    *(unload_adapter(http, url, key, adapter_name(tenant, old)) for url in engines)
                )
            except httpx.HTTPError as exc:  # served already: an engine down keeps it a while
                log.warning("%s stays loaded: %s", adapter_name(tenant, old), exc)
        await record_step(
            db, tenant, self.config.method, trainer.state.step, version, metrics, samples
        )
        await asyncio.to_thread(
            trainer.prune, directory, self.settings.trainer.keep_checkpoints, {version}
        )
        self.console.print(
            f"tenant {tenant} step {trainer.state.step} v{version}: loss {metrics.loss:+.4f} "
            f"reward {metrics.mean_reward:+.3f} ({metrics.n_samples} samples) -> {adapter}"
        )
        return version, metrics

    def _retired(self, tenant: str, version: int) -> list[int]:
        """The tenant's versions no gateway routes to any more, now that `version` serves: those
        replaced over `retire_after_s` ago. A gateway learns of a new adapter from the engines'
        lists every `gateway.health_interval_s`, and a call it routed then may still run: a
        tenant's steps came every ~3 s in `learning_bench --tenants 2` (2 cores), and unloading
        v(N-2) at once refused calls the gateway still sent there."""
        now = time.monotonic()
        if tenant not in self.serving:  # a new trainer: v(N-1) is replaced now, v(N-2) long ago
            self.replaced[tenant] = [(version - 2, 0.0)] if version > 2 else []
            if version > 1:
                self.serving[tenant] = version - 1
        replaced = self.replaced.setdefault(tenant, [])
        if self.serving.get(tenant) not in (None, version):
            replaced.append((self.serving[tenant], now))
        self.serving[tenant] = version
        retired = [v for v, at in replaced if now - at > self.retire_after_s and v != version]
        self.replaced[tenant] = [(v, at) for v, at in replaced if v not in retired]
        return retired

    async def _following_serving(
        self, tenant: str, trainer: AdapterTrainer, db: async_sessionmaker[AsyncSession]
    ) -> AdapterTrainer:
        """After `rollback --tenant` (or, gated, a rejection of the newest), its adapter goes on
        from the version served, not from the one it made last (loaded again from that
        checkpoint, without optimizer moments; a new adapter where none was served)."""
        view = await serving_view_or_none(db, tenant)  # None: asked again at its next step
        head = trainer.state.version
        if view is None:
            return trainer
        if self.gated:  # candidates newer than the served version are the normal case
            if head not in view.rejected:
                return trainer
        elif not view.serving_path or not 0 < view.serving < head:
            return trainer
        folder = Path(view.serving_path) if view.serving_path else None
        base = self._shared()
        await asyncio.to_thread(base.remove, tenant)
        resumed = await asyncio.to_thread(AdapterTrainer, base, tenant, resume=folder)
        resumed.state.step = trainer.state.step  # steps count on: each is recorded once
        self.trainers[tenant] = resumed
        self.serving[tenant] = view.serving  # its newer ones left the engines with the rollback
        self.console.print(
            f"tenant {tenant}: serving is v{view.serving}, goes on from it (was v{head})"
        )
        return resumed
