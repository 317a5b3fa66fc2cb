"""How events travel in and out of JSONB columns, shared by every part of the state."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from sqlalchemy import Text, bindparam, cast
from sqlalchemy.dialects.postgresql import JSONB

from claw_stream.events import Judgement, decode_event


def as_payload(event: Any) -> dict[str, Any]:
    return event.model_dump(mode="json")


# JSON's escape of a NUL character (after an even run of backslashes: not an escaped "\u")
_NUL = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")


def as_json(event: Any) -> str:
    """An event as the JSON text that `jsonb_param` binds. A NUL character in its text becomes
    U+FFFD: Postgres refuses NUL in JSONB text, and the whole multi-row insert with it (an
    answer of the tests' tools model held one; the worker retried the batch for good and 36 of
    39 Steps were never archived). The topic keeps the record as it came."""
    text = str(event.model_dump_json())
    return _NUL.sub(r"\1\\ufffd", text) if "\\u0000" in text else text


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
