"""The gateway's model routes as FastAPI declares them (models, chat, Responses, Messages,
Gemini), health and metrics, under every prefix of `paths.PREFIXES` (Gemini's under
`paths.GEMINI_PREFIXES`).

POSTs to the model routes are served by `FrontDoor` before FastAPI sees them; they stay
declared here for the OpenAPI document.
"""

from __future__ import annotations

import os
from typing import Any

import httpx
import orjson
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, multiprocess

from claw_stream.dialect import OpenAIError
from claw_stream.gateway.doors import DOORS, Door
from claw_stream.gateway.paths import GEMINI_PREFIXES, MODELS, PREFIXES
from claw_stream.gateway.service import Gateway
from claw_stream.gateway.sessions.auth import session_names
from claw_stream.gateway.upstreams import RETRY_AFTER
from claw_stream.names import adapter_policy

router = APIRouter()


def _gateway(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


@router.get("/healthz")
async def healthz(request: Request) -> dict[str, Any]:
    """The gateway's state and each engine's: healthy, calls in flight."""
    gateway = _gateway(request)
    return {
        **gateway.health(),
        "backends": [
            {"url": b.url, "healthy": b.healthy, "inflight": b.inflight}
            for b in gateway.pool.backends
        ],
    }


@router.get("/health")
async def health(request: Request) -> Response:
    """AReaL's health check: 200 while some engine is healthy, else 503; whether Postgres is
    reachable and how many records wait for it."""
    gateway = _gateway(request)
    healthy = sum(1 for b in gateway.pool.backends if b.healthy)
    body = {
        "status": "ok" if healthy else "unavailable",
        "healthy_engines": healthy,
        "engines": len(gateway.pool.backends),
        # calls of known sessions are served without Postgres: it does not make this 503
        "postgres": "down" if gateway.sessions.outage.down else "up",
        "journal": gateway.journal_depth(),
    }
    return Response(
        orjson.dumps(body),
        200 if healthy else 503,
        None if healthy else RETRY_AFTER,
        media_type="application/json",
    )


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """Prometheus metrics of the gateway (all its processes)."""
    gateway = _gateway(request)
    registry = gateway.metrics.registry
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        registry.register(gateway.spool_depth)
        registry.register(gateway.consumer_lag)
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


async def models(request: Request) -> Response:
    """The models the engines serve: the policy, and the caller's own tenant's adapters."""
    gateway = _gateway(request)
    named = session_names(request.headers, None, request.path_params.get("session_id"))
    caller, _ = await gateway.auth.authorize(request.headers, "model_call", named)
    backend = gateway.pool.choose(None, set())
    if backend is None:
        raise OpenAIError(503, "no inference backend can answer right now", headers=RETRY_AFTER)
    try:
        r = await gateway.http.get(f"{backend.url}/v1/models", timeout=5)
    except httpx.HTTPError as exc:
        raise OpenAIError(503, f"backend unavailable: {exc}", headers=RETRY_AFTER) from None
    if r.status_code != 200 or caller.credential == "admin":
        return Response(r.content, status_code=r.status_code, media_type="application/json")
    # tenants' adapters are listed to their own tenant only (and to the admin key)
    tenant = gateway.auth.tenant(caller, request.headers)
    listed = r.json()
    mine = (gateway.settings.policy_name, tenant)
    listed["data"] = [
        card for card in listed.get("data") or [] if adapter_policy(card.get("id")) in (None, *mine)
    ]
    return JSONResponse(listed)


async def model_call(request: Request) -> None:
    """Declared for the OpenAPI document only: `FrontDoor` serves every POST to these paths
    (`paths.route` takes each of them) before FastAPI sees it."""
    raise OpenAIError(404, f"no front door serves {request.url.path}")


def _body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def _declare(prefix: str, door: Door) -> None:
    router.add_api_route(
        prefix + door.endpoint,
        model_call,
        methods=["POST"],
        tags=[door.tag],
        description=door.description,
        openapi_extra=_body(door.request.model_json_schema()),
    )


for _prefix in PREFIXES:
    router.add_api_route(_prefix + MODELS, models, methods=["GET"], tags=["openai"])
    for _door in DOORS:
        if not _door.own_version:
            _declare(_prefix, _door)
for _prefix in GEMINI_PREFIXES:
    for _door in DOORS:
        if _door.own_version:
            _declare(_prefix, _door)
