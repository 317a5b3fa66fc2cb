"""The console's pages and buttons under /console: server-rendered (jinja2), no script needed, no
asset from a network. Every route asks for the admin key first (401 without it, 403 for a
session's key); every button is a form posted here, which calls the same route or CLI code
(`actions.py`) and comes back to the page with what happened."""

from __future__ import annotations

import base64
import time
import uuid
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, quote

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape

from claw_stream.console import actions, reading
from claw_stream.console.access import COOKIE, caller, presented
from claw_stream.console.service import Console
from claw_stream.store import skills as skill_store
from claw_stream.timerange import parse_time

router = APIRouter(prefix="/console", tags=["console"], include_in_schema=False)
PAGES = Environment(
    loader=PackageLoader("claw_stream.console", "templates"),
    autoescape=select_autoescape(["html", "j2"]),
)


class Refused(Exception):
    def __init__(self, status: int):
        self.status = status


def _console(request: Request) -> Console:
    console: Console = request.app.state.console
    return console


def _ago(at: datetime | None) -> str:
    if at is None:
        return ""
    seconds = (datetime.now(UTC) - at).total_seconds()
    if seconds < 90:
        return f"{seconds:.0f} s ago"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h ago"
    return at.strftime("%Y-%m-%d %H:%M")


PAGES.filters["ago"] = _ago


def _page(name: str, status: int = 200, **values: Any) -> HTMLResponse:
    began = time.perf_counter()
    html = PAGES.get_template(name).render(**values)
    response = HTMLResponse(html, status)
    response.headers["Server-Timing"] = f"render;dur={(time.perf_counter() - began) * 1000:.1f}"
    return response


async def _admin(request: Request) -> Console:
    console = _console(request)
    who = await caller(presented(request), console.admin_key, console.db)
    if who != "admin":
        raise Refused(403 if who == "session" else 401)
    return console


def refused(status: int) -> HTMLResponse:
    """401: the login form; 403: a session's key opens no console."""
    return _page("login.html.j2", status, forbidden=status == 403)


async def _form(request: Request) -> dict[str, str]:
    fields = parse_qs((await request.body()).decode(), keep_blank_values=True)
    return {k: v[-1] for k, v in fields.items()}


def _back(path: str, said: str, error: bool = False, anchor: str = "") -> RedirectResponse:
    """To `path` again, saying what happened (the fragment after the query, or the query is
    lost in it)."""
    sep = "&" if "?" in path else "?"
    fragment = f"#{anchor}" if anchor else ""
    return RedirectResponse(
        f"{path}{sep}{'error' if error else 'said'}={quote(said)}{fragment}", status_code=303
    )


def _gateway_url(request: Request, console: Console) -> str:
    """Where the buttons' routes are: the configured gateway, else this server (the gateway
    that serves the console)."""
    configured = console.settings.console.gateway_url
    return configured or str(request.base_url).rstrip("/")


# --- login -----------------------------------------------------------------------------------


@router.get("/login")
async def login_page(request: Request, key: str | None = None) -> Response:
    """`claw-stream up` prints /console/login?key=<admin key>: the key becomes an HttpOnly
    cookie and the address bar loses it."""
    console = _console(request)
    if key is None:
        return refused(401)
    who = await caller(key, console.admin_key, console.db)
    if who != "admin":
        return refused(403 if who == "session" else 401)
    done = RedirectResponse("/console", status_code=303)
    done.set_cookie(COOKIE, key, httponly=True, samesite="strict", path="/console")
    return done


@router.post("/login")
async def login(request: Request) -> Response:
    return await login_page(request, (await _form(request)).get("key") or None)


@router.get("/logout")
async def logout() -> Response:
    done = RedirectResponse("/console/login", status_code=303)
    done.delete_cookie(COOKIE, path="/console")
    return done


# --- pages -----------------------------------------------------------------------------------


@router.get("")
async def overview(request: Request) -> Response:
    console = await _admin(request)
    async with console.db.connect() as conn:
        traffic = await reading.traffic(conn)
        versions = await reading.versions(conn, console.settings.policy_name)
    curve = await console.curve_png()
    return _page(
        "overview.html.j2",
        nav="overview",
        policy=console.settings.policy_name,
        health=await console.health(),
        lags=console.lags(),
        traffic=traffic,
        versions=versions[:12],
        curve=base64.b64encode(curve).decode() if curve else None,
        refresh=console.settings.console.refresh_s,
    )


@router.get("/sessions")
async def sessions(
    request: Request,
    key: str | None = None,
    since: str | None = None,
    outcome: reading.Outcome = "any",
    q: str | None = None,
    page: int = 0,
    said: str | None = None,
    error: str | None = None,
) -> Response:
    console = await _admin(request)
    when: datetime | None = None
    problem = error
    if since:
        try:
            when = parse_time(since)
        except ValueError as exc:
            problem = f"since: {exc}"
    f = reading.SessionFilter(key or None, when, outcome, q or None)
    size = console.settings.console.page_size
    began = time.perf_counter()
    async with console.db.connect() as conn:
        lines, more = await reading.sessions_page(conn, f, max(page, 0), size)
    query_ms = (time.perf_counter() - began) * 1000
    response = _page(
        "sessions.html.j2",
        nav="sessions",
        lines=lines,
        more=more,
        page=max(page, 0),
        filters={"key": key or "", "since": since or "", "outcome": outcome, "q": q or ""},
        said=said,
        error=problem,
    )
    response.headers["Server-Timing"] += f", query;dur={query_ms:.1f}"
    return response


@router.get("/sessions/{session_id}")
async def session(
    request: Request,
    session_id: str,
    page: int = 0,
    said: str | None = None,
    error: str | None = None,
) -> Response:
    console = await _admin(request)
    size = console.settings.console.turns_per_page
    async with console.db.connect() as conn:
        view = await reading.session_view(conn, session_id, max(page, 0), size)
    if view.line is None and not view.turns:
        return _page("missing.html.j2", 404, nav="sessions", what=f"session {session_id}")
    return _page(
        "session.html.j2",
        nav="sessions",
        session_id=session_id,
        view=view,
        first_turn=view.page * size,
        said=said,
        error=error,
    )


@router.get("/versions")
async def versions(request: Request, said: str | None = None, error: str | None = None) -> Response:
    console = await _admin(request)
    async with console.db.connect() as conn:
        found = await reading.versions(conn, console.settings.policy_name)
    return _page(
        "versions.html.j2",
        nav="versions",
        policy=console.settings.policy_name,
        versions=found,
        said=said,
        error=error,
    )


@router.get("/skills")
async def skills(
    request: Request,
    whose: str | None = None,
    retired: bool = False,
    said: str | None = None,
    error: str | None = None,
) -> Response:
    console = await _admin(request)
    states = skill_store.STATES if retired else ("active", "pinned")
    async with console.db.connect() as conn:
        found = await skill_store.listing(conn, whose or None, states, limit=500)
    return _page(
        "skills.html.j2",
        nav="skills",
        skills=found,
        whose=whose,
        retired=retired,
        said=said,
        error=error,
    )


# --- buttons ---------------------------------------------------------------------------------


async def _skill_change(request: Request, skill_id: str, **change: str) -> Response:
    console = await _admin(request)
    try:
        found = uuid.UUID(skill_id)
        async with console.db.begin() as conn:
            done = await skill_store.steer(conn, found, **change)
    except ValueError as exc:
        return _back("/console/skills", str(exc), error=True)
    if not done:
        return _back("/console/skills", f"no skill {skill_id}", error=True)
    return _back("/console/skills", "skill saved", anchor=f"skill-{skill_id}")


@router.post("/skills/{skill_id}/state")
async def skill_state(request: Request, skill_id: str) -> Response:
    return await _skill_change(request, skill_id, state=(await _form(request)).get("state", ""))


@router.post("/skills/{skill_id}/edit")
async def skill_edit(request: Request, skill_id: str) -> Response:
    return await _skill_change(request, skill_id, text=(await _form(request)).get("text", ""))


@router.post("/skills/{skill_id}/delete")
async def skill_delete(request: Request, skill_id: str) -> Response:
    console = await _admin(request)
    try:
        found = uuid.UUID(skill_id)
    except ValueError:
        return _back("/console/skills", f"no skill {skill_id}", error=True)
    async with console.db.begin() as conn:
        done = await skill_store.remove(conn, found)
    return _back("/console/skills", "skill deleted" if done else f"no skill {skill_id}", not done)


@router.post("/sessions/{session_id}/train")
async def switch_training(request: Request, session_id: str) -> Response:
    console = await _admin(request)
    enabled = (await _form(request)).get("enabled") == "true"
    here = f"/console/sessions/{quote(session_id)}"
    try:
        said = await actions.switch_training(
            console.http, _gateway_url(request, console), console.admin_key, session_id, enabled
        )
    except actions.ActionError as exc:
        return _back(here, str(exc), error=True)
    return _back(here, said)


@router.post("/sessions/{session_id}/forget")
async def forget(request: Request, session_id: str) -> Response:
    console = await _admin(request)
    here = f"/console/sessions/{quote(session_id)}"
    if (await _form(request)).get("confirm") != session_id:
        return _back(here, "not forgotten: type the session id to confirm", error=True)
    try:
        said = await actions.forget(
            console.http, _gateway_url(request, console), console.admin_key, session_id
        )
    except actions.ActionError as exc:
        return _back(here, str(exc), error=True)
    return _back("/console/sessions", said)


@router.post("/sessions/{session_id}/label")
async def label(request: Request, session_id: str) -> Response:
    console = await _admin(request)
    form = await _form(request)
    page = form.get("page", "0")
    here = f"/console/sessions/{quote(session_id)}" + (f"?page={page}" if page.isdigit() else "")
    try:
        score = int(form.get("score", ""))
        said = await actions.label(
            console.http,
            _gateway_url(request, console),
            console.admin_key,
            session_id,
            form.get("step_id", ""),
            score,
            form.get("note", ""),
        )
    except ValueError:
        return _back(here, "a label is good (1) or bad (-1)", error=True)
    except actions.ActionError as exc:
        return _back(here, str(exc), error=True)
    return _back(here, said, anchor=f"step-{form.get('step_id', '')}")


@router.post("/versions/{version}/serve")
async def serve(request: Request, version: int) -> Response:
    console = await _admin(request)
    reason = (await _form(request)).get("reason") or "from the console"
    try:
        said = await actions.serve(console.settings, version, reason)
    except actions.ActionError as exc:
        return _back("/console/versions", str(exc), error=True)
    return _back("/console/versions", said)


@router.get("/curve.png")
async def curve(request: Request) -> Response:
    console = await _admin(request)
    png = await console.curve_png()
    return Response(png or b"", 200 if png else 404, media_type="image/png")


def install(app: FastAPI, console: Console) -> None:
    """The console on `app` (the gateway's, or its own): its state, routes and refusals."""

    async def refuse(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, Refused)
        return refused(exc.status)

    app.state.console = console
    app.include_router(router)
    app.add_exception_handler(Refused, refuse)
