"""JSON Schemas of the event contract, written to `topics/schemas/` and checked for staleness."""

from __future__ import annotations

import json
from pathlib import Path

from claw_stream.events import EVENT_TYPES
from claw_stream.resources import topics_dir


def render_schemas() -> dict[str, str]:
    """File name -> JSON text, one schema per value model."""
    out = {}
    for name, model in sorted(EVENT_TYPES.items()):
        schema = model.model_json_schema(mode="serialization")
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        schema["$id"] = f"claw-stream/{name}.schema.json"
        out[f"{name}.schema.json"] = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    return out


def write_schemas(directory: Path | None = None) -> list[Path]:
    directory = directory or topics_dir() / "schemas"
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for filename, text in render_schemas().items():
        path = directory / filename
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            written.append(path)
    return written


def stale_schemas(directory: Path | None = None) -> list[str]:
    """Names of schema files that are missing or differ from what the models generate."""
    directory = directory or topics_dir() / "schemas"
    return [
        name
        for name, text in render_schemas().items()
        if not (directory / name).exists() or (directory / name).read_text() != text
    ]
