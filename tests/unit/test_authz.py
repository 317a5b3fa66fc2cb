"""The authorization matrix's decision as pure logic: every route kind x credential x which
session the request names, in every place it can name one."""

from __future__ import annotations

from typing import get_args

import pytest

from claw_stream.dialect import OpenAIError
from claw_stream.gateway.sessions.authz import MATRIX, Credential, RouteKind, decide

OWN, OTHER = "s-own", "s-other"
PLACES = ("the URL path", "X-Session-Id", "the body's session_id")

# (kind, credential) -> what it acts on when it names: nothing, its own session, another one.
# An int is the refusal's status. Written out, not derived from MATRIX, so a change to the
# matrix has to change this table too.
EXPECTED: dict[tuple[RouteKind, Credential], tuple[str | int | None, ...]] = {
    ("model_call", "admin"): (None, OWN, OTHER),
    ("model_call", "client"): (None, OWN, OTHER),
    ("model_call", "session"): (OWN, OWN, 403),
    ("model_call", "none"): (401, 401, 401),
    ("session_route", "admin"): (None, OWN, OTHER),
    ("session_route", "client"): (None, OWN, OTHER),
    ("session_route", "session"): (OWN, OWN, 403),
    ("session_route", "none"): (401, 401, 401),
    ("admin_route", "admin"): (None, OWN, OTHER),
    ("admin_route", "client"): (401, 401, 401),
    ("admin_route", "session"): (401, 401, 401),
    ("admin_route", "none"): (401, 401, 401),
}


def outcome(kind: RouteKind, credential: Credential, named: dict[str, str | None]) -> object:
    own = OWN if credential == "session" else None
    try:
        return decide(kind, credential, own, named)
    except OpenAIError as exc:
        return exc.status


def test_the_table_covers_the_whole_matrix() -> None:
    pairs = {(k, c) for k in get_args(RouteKind) for c in get_args(Credential)}
    assert set(EXPECTED) == pairs
    assert {(k, c) for k, row in MATRIX.items() for c in row} == pairs


@pytest.mark.parametrize(("kind", "credential"), list(EXPECTED))
@pytest.mark.parametrize("place", PLACES)
def test_each_credential_on_nothing_its_own_and_another_session(
    kind: RouteKind, credential: Credential, place: str
) -> None:
    nothing, own, other = EXPECTED[kind, credential]
    assert outcome(kind, credential, {p: None for p in PLACES}) == nothing
    assert outcome(kind, credential, {place: OWN}) == own
    assert outcome(kind, credential, {place: OTHER}) == other


@pytest.mark.parametrize("place", PLACES)
def test_a_session_key_naming_another_session_anywhere_is_refused(place: str) -> None:
    """Its own session in one place does not cover another session in a second place."""
    named: dict[str, str | None] = {p: OWN for p in PLACES}
    named[place] = OTHER
    with pytest.raises(OpenAIError) as refused:
        decide("session_route", "session", OWN, named)
    assert refused.value.status == 403
    assert OTHER in refused.value.message and place in refused.value.message
    assert "only on its own session" in refused.value.message


@pytest.mark.parametrize("credential", ["admin", "client"])
def test_two_different_sessions_in_one_request_are_a_400(credential: Credential) -> None:
    with pytest.raises(OpenAIError) as refused:
        decide("model_call", credential, None, {"the URL path": OWN, "X-Session-Id": OTHER})
    assert refused.value.status == 400 and refused.value.param == "session_id"
    # the same session named twice, or an empty header, is no conflict
    named = {"the URL path": OWN, "X-Session-Id": OWN, "the body's session_id": ""}
    assert decide("model_call", credential, None, named) == OWN


def test_refusals_say_what_is_missing() -> None:
    with pytest.raises(OpenAIError, match="admin key required"):
        decide("admin_route", "session", OWN, {})
    with pytest.raises(OpenAIError, match="an API key is required"):
        decide("model_call", "none", None, {})
