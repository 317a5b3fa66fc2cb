"""A tenant's adapters: replaced ones leave the engines only once no gateway routes to them."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from claw_stream.settings import load_settings
from claw_stream.trainer import tenants
from claw_stream.trainer.tenants import TenantTrainers


def test_replaced_versions_retire_after_the_gateways_had_time_to_move_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = load_settings(data_dir=tmp_path)
    settings.gateway.health_interval_s = 5.0
    trainers = TenantTrainers(settings, tmp_path / "model", Console(quiet=True))
    assert trainers.retire_after_s == 30.0  # 3 gateway refreshes, 30 s at least
    now = [1000.0]
    monkeypatch.setattr(tenants.time, "monotonic", lambda: now[0])

    # a new trainer (a restart) at v5: what came before v4 is long replaced
    assert trainers._retired("alice", 5) == [3]
    # steps every 3 s (as the bench measured): nothing the gateways may still route to leaves
    for version in (6, 7, 8):
        now[0] += 3
        assert trainers._retired("alice", version) == []
    now[0] += 31  # v4 was replaced 40 s ago ... v7 31 s: all gone; v8 went just now
    assert trainers._retired("alice", 9) == [4, 5, 6, 7]
    assert trainers._retired("alice", 10) == []  # each unloaded once
    assert trainers._retired("bob", 1) == []  # a tenant's versions are its own

    trainers.forget("alice")
    assert trainers._retired("alice", 1) == []
