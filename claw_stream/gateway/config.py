"""The gateway's settings section (`gateway:`, env CLAW_GATEWAY__<FIELD>), redaction with it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from claw_stream.gateway.redaction import DEFAULT_PATTERNS, RedactionError, compile_patterns


class RedactionSettings(BaseModel):
    """What the gateway redacts from a Step's text before it is published (docs/operations/privacy.md);
    env CLAW_GATEWAY__REDACTION__<FIELD>."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(
        default=True,
        description="Redact secrets from a Step's text before it is published; off: Steps are "
        "published as the agent sent them.",
    )
    patterns: dict[str, str] = Field(
        default_factory=lambda: dict(DEFAULT_PATTERNS),
        description="Name -> regular expression; a match becomes [REDACTED:<name>]. Merged over "
        "the defaults (api_key, github_token, aws_access_key_id, slack_token, private_key, jwt, "
        "bearer_token, email, phone); an empty regular expression switches one off.",
    )
    redactors: list[str] = Field(
        default_factory=list,
        description="Custom redactors, 'module:function' taking and returning text (a function "
        "of the text alone: results are cached); run after the patterns.",
    )
    prompt_secrets: Literal["mask", "keep"] = Field(
        default="mask",
        description="A Step whose prompt had something redacted: mask = published with no "
        "prompt token ids and train false (archived, never judged or trained); keep = trained "
        "as it is (its prompt token ids still hold the secret).",
    )
    cache_mb: float = Field(
        default=32.0,
        ge=0,
        description="Redacted texts kept per gateway process (about a byte per character), so a "
        "prompt repeated on every call is scanned once.",
    )

    @field_validator("patterns", mode="before")
    @classmethod
    def _over_defaults(cls, value: Any) -> Any:
        return {**DEFAULT_PATTERNS, **value} if isinstance(value, dict) else value

    @field_validator("patterns")
    @classmethod
    def _compiles(cls, value: dict[str, str]) -> dict[str, str]:
        try:
            compile_patterns(value)
        except RedactionError as exc:
            raise ValueError(str(exc)) from None
        return value


class GatewaySettings(BaseModel):
    """The gateway (`claw-stream gateway`); env CLAW_GATEWAY__<FIELD>."""

    model_config = ConfigDict(extra="forbid")

    host: str = Field(default="127.0.0.1", description="Address the gateway listens on.")
    port: int = Field(
        default=8000,
        ge=1,
        le=65535,
        description="Port the gateway listens on; agents use http://HOST:PORT/v1.",
    )
    backends: list[str] = Field(
        default_factory=lambda: ["http://127.0.0.1:8001"],
        description="Base URLs of the engines (vLLM or built-in) that answer the calls; a call "
        "goes to another when one fails. `claw-stream up` sets its own engine.",
    )
    backend_kind: Literal["engine", "hosted"] = Field(
        default="engine",
        description="engine: vLLM or the built-in engine, asked for the token ids and "
        "log-probs that training needs. hosted: any OpenAI-compatible API (a model we cannot "
        "train): asked the client's request as it is; its Steps carry no token ids and never "
        "make samples, but they are archived and judged, and teach skills.",
    )
    backend_api_key: str | None = Field(
        default=None,
        description="Sent to the backends as `Authorization: Bearer` (a hosted API's key).",
    )
    client_key: str | None = Field(
        default=None,
        description="The key of agents that name their session by URL path, X-Session-Id or "
        "body: it acts on any session it names (session keys act only on their own). Unset: "
        "any caller without a session key counts as a client.",
    )
    max_body_bytes: int = Field(
        default=16 * 1024 * 1024,
        ge=1024,
        description="Larger request bodies get 413 before they are read whole (Content-Length, "
        "or counted as they arrive).",
    )
    max_concurrent_per_key: int | None = Field(
        default=None,
        ge=1,
        description="Calls in flight per key and gateway process; more get 429 with "
        "Retry-After. None: no limit (the embedded default).",
    )
    session_idle_timeout_s: float = Field(
        default=3600.0,
        gt=0,
        description="A session with no call for this many seconds is ended (reason idle_timeout).",
    )
    join_by_prefix: bool = Field(
        default=True,
        description="A call with no session id or key joins the session whose main line its "
        "messages extend (OpenClaw sends no session id); off: each such call is a session.",
    )
    join_window_s: float = Field(
        default=7 * 24 * 3600.0,
        gt=0,
        description="How long a session's main line stays joinable after its last call.",
    )
    untrained_keys: list[str] = Field(
        default_factory=list,
        description="Keys (client or session keys) whose calls are archived but never judged "
        "or trained.",
    )
    strict_keys: bool = Field(
        default=False,
        description="A session key whose session ended gets 401 (AReaL) instead of starting "
        "the next episode.",
    )
    strict_models: bool = Field(
        default=False,
        description="Answer 404 for a model name no backend serves and model_map does not map "
        "(vLLM's behaviour). Off: any such name reaches the policy, since clients send the name "
        "their own docs use (`default`, `your-model-name`, a hub id).",
    )
    model_map: dict[str, str] = Field(
        default_factory=dict,
        description="Client model name -> the name the engines serve it as (the policy, a LoRA "
        "adapter such as policy@v3); checked before anything else.",
    )
    responses_store_size: int = Field(
        default=1024,
        ge=0,
        description="Responses API: how many stored responses (store: true) each gateway process "
        "keeps for previous_response_id, oldest dropped first; 0 stores none.",
    )
    publish_timeout_s: float = Field(
        default=5.0,
        gt=0,
        description="Seconds to wait for the broker to acknowledge an event; past it the event "
        "is spooled to disk and sent later.",
    )
    archive_check: bool = Field(
        default=True,
        description="Keep each Step and session event (on disk) until the worker's archive "
        "has it, and send again what the broker acknowledged and then lost (a broker "
        "restarted without its records). Off: the broker's acknowledgement is the end.",
    )
    resend_after_s: float = Field(
        default=30.0,
        gt=0,
        description="An event not archived this long is looked for on its topic (and sent "
        "again when it is not there).",
    )
    spool_alarm_s: float = Field(
        default=60.0, gt=0, description="/healthz is degraded while a spooled event is older."
    )
    archive_alarm_s: float = Field(
        default=900.0,
        gt=0,
        description="/healthz is degraded while an event waits longer for the archive (no "
        "worker running?).",
    )
    lag_every_s: float = Field(
        default=5.0,
        ge=0,
        description="Read the pipeline's consumer lag from the broker this often, for the "
        "`claw_consumer_lag` gauge of /metrics (0: off).",
    )
    upstream_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="Seconds to wait for an engine to send more of its answer before the call "
        "fails.",
    )
    health_interval_s: float = Field(
        default=5.0,
        gt=0,
        description="How often, in seconds, each engine's /health is checked and its "
        "/v1/models (the adapters it serves) read again.",
    )
    spool_dir: Path | None = Field(
        default=None,
        description="Default DATA_DIR/spool/gateway-PORT; each process spools in a slot of it.",
    )
    workers: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Processes sharing the port (one per core helps when the gateway is busy).",
    )
    redaction: RedactionSettings = Field(
        default_factory=RedactionSettings,
        description="What is redacted from a Step's text before it is published.",
    )

    @field_validator("client_key")
    @classmethod
    def _empty_is_none(cls, value: str | None) -> str | None:
        return value or None
