"""How events travel in and out of JSONB columns, shared by every part of the state."""

from __future__ import annotations

import json
import uuid
from typing import Any

from sqlalchemy import Text, bindparam, cast
from sqlalchemy.dialects.postgresql import JSONB

from claw_stream.events import Judgement, decode_event


def as_payload(event: Any) -> dict[str, Any]:
    return event.model_dump(mode="json")


def as_json(event: Any) -> str:
    """An event as the JSON text that `jsonb_param` binds."""
    return str(event.model_dump_json())


def jsonb_param() -> Any:
    """The `payload` of an insert bound as text (`payload_json`, from `as_json`) and cast by
    Postgres: pydantic writes the JSON itself, where `as_payload` built dicts that SQLAlchemy then
    serialised in Python (together ~6% of the worker's CPU in bench/pipeline_bench.py)."""
    return cast(bindparam("payload_json", type_=Text), JSONB)


def as_text(column: Any) -> Any:
    """A JSONB column read as text, which the event model parses once (read as JSON, asyncpg
    parsed it into dicts that `decode` serialised again for the model: ~15% of the worker's
    CPU in bench/pipeline_bench.py)."""
    return cast(column, Text)


def decode(model: type, payload: Any) -> Any:
    raw = payload if isinstance(payload, str | bytes) else json.dumps(payload)
    return decode_event(model, raw)


Pair = tuple[str, int]  # (session id, segment)
# judgements a caller has just stored, by id: read back, each cost a JSON decode (with the
# judgements' own decode, ~20% of the worker's CPU in bench/pipeline_bench.py)
Known = dict[uuid.UUID, Judgement]
