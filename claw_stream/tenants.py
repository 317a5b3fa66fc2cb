"""Tenants: whose agent a call serves, so that each user's agent can have its own adapter.

A tenant is named by a session key (`/rl/start_session` with `tenant`, `claw-stream connect
--tenant`), by an API key listed in `tenants.keys` (several keys may name one tenant), or, where
`tenants.from_agent_id` is on, by the `X-Agent-Id` header of a call made with the client key.
The engines serve a tenant's adapter as `tenant@vN` beside the shared policy's `policy@vN`; a
tenant without an adapter is served by the shared policy, as every call was before tenants.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

TENANT_HEADER = "x-agent-id"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def check_tenant(name: str, policy: str | None = None) -> str:
    """`name` if it can name a tenant (and so an adapter `name@vN`) beside `policy`, whose
    adapters' names (`policy@vN`) it would share; ValueError otherwise."""
    if not _NAME.match(name):
        raise ValueError(
            f"a tenant is 1-64 letters, digits, '_', '.' or '-', starting with a letter or a "
            f"digit; got {name!r}"
        )
    if name == policy:
        raise ValueError(f"tenant {name!r} is the policy's name: choose another")
    return name


class TenantSettings(BaseModel):
    """Who a call's tenant is (`tenants:`, env CLAW_TENANTS__<FIELD>)."""

    model_config = ConfigDict(extra="forbid")

    keys: dict[str, str] = Field(
        default_factory=dict,
        description="API key -> tenant: a call with one of these keys is its tenant's (it may "
        "call as the client key does, for its tenant only).",
    )
    from_agent_id: bool = Field(
        default=False,
        description="A call with the client key names its tenant by X-Agent-Id (as OpenClaw's "
        "agents can send it); a session key or a tenant's key that names another is refused.",
    )

    adapters: list[str] | Literal["all"] = Field(
        default_factory=list,
        description="Tenants trained an adapter of their own (`all`, or a list; empty: none): "
        "their samples train it, never the shared policy, and their calls are served by it. "
        "All adapters share one base model in the trainer and in each engine.",
    )
    adapter_min_samples: int = Field(
        default=0,
        ge=0,
        description="A tenant's adapter starts after this many of its samples (judged turns "
        "with a signal) reached the trainer; the ones before train the shared policy.",
    )
    lora_r: int = Field(default=16, ge=1, description="Rank of a tenant's adapter.")
    lora_alpha: int = Field(
        default=32,
        ge=1,
        description="LoRA alpha of a tenant's adapter: its update is scaled by alpha / lora_r.",
    )
    lr: float | None = Field(
        default=None,
        gt=0,
        description="Learning rate of a tenant's adapter (default: trainer.lr). LoRA adapters "
        "are usually trained at ~10x a full fine-tune's rate (learning_bench --tenants 2: 5e-4).",
    )

    def has_adapter(self, tenant: str | None) -> bool:
        """Whether `tenant` is one that gets an adapter of its own (its samples counted aside)."""
        return tenant is not None and (self.adapters == "all" or tenant in self.adapters)

    @field_validator("keys")
    @classmethod
    def _names(cls, keys: dict[str, str]) -> dict[str, str]:
        for tenant in keys.values():
            check_tenant(tenant)
        return keys
