"""What became of each turn of a session: judged, sampled, trained, or why not.

A turn that gives no sample has a reason a user can act on (`claw-stream doctor` prints it): a
side call is never trained, the last turn waits for the user's next words, a switched-off
session or a masked secret keeps a turn out, the judge may be busy or have given up, a sample
may carry no signal or be too stale. The facts come from one query over the archive and the
worker's state; `why` reads them.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection


@dataclass(frozen=True)
class TurnFacts:
    session_id: str
    step_id: uuid.UUID
    turn_index: int
    turn_type: str  # main | side, as the worker classified it (else as the gateway did)
    step_train: bool
    masked: bool  # a secret was masked from its prompt: no prompt ids to train on
    session_train: bool
    placed: bool  # the worker archived and placed its step
    stitched: bool  # it became a turn: the next main step came (or the session closed)
    has_next_state: bool | None
    token_drift: str | None
    judged: bool
    judge_skipped: bool  # never judged on purpose (switched off, or token drift dropped)
    retry_attempts: int | None
    retry_error: str | None
    retry_next_at: datetime | None
    gave_up: bool
    status: str | None  # the turn's own sample: published, held, pending, no_signal, dropped
    reward: float | None
    reward_source: str | None
    trained_in_step: int | None
    n_skills: int = 0  # the skills the gateway added to its prompt

    @property
    def sampled(self) -> bool:
        """Made a sample that trains (or will)."""
        return self.status in ("published", "pending", "held")

    @property
    def trained(self) -> bool:
        return self.trained_in_step is not None


def why(f: TurnFacts) -> str:
    """Where the turn stands, in words; for a turn without a sample, why it has none."""
    said = _why(f)
    if f.token_drift and not said.startswith("token_drift"):
        said += f"; {f.token_drift}"
    return said


def _why(f: TurnFacts) -> str:
    if f.turn_type == "side":
        return "side call (a title, a summary, a compaction): recorded, never trained"
    if f.masked:
        return "redacted: a secret was masked from its prompt, so it has no tokens to train"
    if not f.step_train:
        return "not for training: the call said X-Claw-Train: false (or its key is untrained)"
    if f.trained:
        return f"trained in step {f.trained_in_step} (reward {f.reward:+g}, {f.reward_source})"
    if not f.session_train:
        return (
            "session switched off: the console's switch, or POST /rl/sessions/ID/train"
            ' {"enabled": true}, lets it train'
        )
    if not f.placed:
        return "not placed yet: the worker has not archived it (is the worker running?)"
    if not f.stitched:
        return "no next state yet: waits for what the user says next (or the session's end)"
    if f.token_drift and f.judge_skipped:
        return f"{f.token_drift} (worker.token_drift: drop: dead-lettered, never trained)"
    if f.gave_up:
        return f"judge error: gave up after {f.retry_attempts} attempts: {f.retry_error}"
    if f.retry_attempts and not f.judged:
        at = f.retry_next_at.strftime("%H:%M:%S") if f.retry_next_at else "soon"
        return f"judge busy: asked again at {at} (attempt {f.retry_attempts}): {f.retry_error}"
    if not f.judged:
        if f.has_next_state is False:
            return "no next state yet: waits for what the user says next (or the session's end)"
        return "waiting for the judge"
    if f.status is None:
        if f.has_next_state is False:
            return "no next state: the user said nothing after it, nothing to judge it by"
        return "judged: its sample is assembled once its signals are final"
    if f.status == "no_signal":
        return "no signal: neither the user's words nor the judge said good or bad (reward 0)"
    if f.status == "dropped":
        return "stale: too many versions behind when released (worker.max_staleness)"
    if f.status == "held":
        return "held while new weights are loaded"
    return f"sampled (reward {f.reward:+g}, {f.reward_source}): waiting for the trainer"


_FACTS = """
WITH chosen AS (
    SELECT session_id FROM steps
    WHERE (cardinality(CAST(:sessions AS text[])) = 0 OR session_id = ANY(CAST(:sessions AS text[])))
        AND (CAST(:leave_out AS text) IS NULL OR group_id IS DISTINCT FROM :leave_out)
    GROUP BY session_id ORDER BY max(created_at) DESC LIMIT :last
)
SELECT st.session_id, st.step_id, st.turn_index,
    coalesce(ps.turn_type, st.turn_type) AS turn_type,
    st.train AS step_train,
    coalesce(jsonb_array_length(sp.payload -> 'prompt_token_ids'), 1) = 0 AS masked,
    coalesce(se.train, true) AS session_train,
    ps.step_id IS NOT NULL AS placed,
    t.turn_id IS NOT NULL AS stitched,
    t.has_next_state,
    t.token_drift,
    j.judgement_id IS NOT NULL AS judged,
    coalesce(j.judge_model = '', false) AS judge_skipped,
    jr.attempts AS retry_attempts, jr.last_error AS retry_error, jr.next_at AS retry_next_at,
    jr.gave_up_at IS NOT NULL AS gave_up,
    s.status, s.reward, s.reward_source, s.trained_in_step,
    coalesce(jsonb_array_length(
        sp.payload -> 'request' -> 'extra' -> 'claw_skills' -> 'ids'), 0) AS n_skills
FROM steps st
JOIN chosen USING (session_id)
LEFT JOIN pipeline_steps ps ON ps.step_id = st.step_id
LEFT JOIN step_payloads sp ON sp.step_id = st.step_id
LEFT JOIN sessions se ON se.session_id = st.session_id
LEFT JOIN turns t ON t.step_id = st.step_id
LEFT JOIN judgements j ON j.turn_id = t.turn_id
LEFT JOIN judge_retries jr ON jr.turn_id = t.turn_id
LEFT JOIN LATERAL (
    SELECT status, reward, reward_source, trained_in_step FROM samples
    WHERE samples.turn_id = t.turn_id AND reward_source <> 'episode'
    ORDER BY created_at LIMIT 1
) s ON true
ORDER BY st.session_id, st.turn_index, st.created_at
"""


async def turn_facts(
    conn: AsyncConnection,
    sessions: Sequence[str] = (),
    last: int = 5,
    leave_out_group: str | None = None,
) -> list[TurnFacts]:
    """Every step of these sessions (none given: the `last` sessions with a step, but for
    those of `leave_out_group`), in order."""
    rows = await conn.execute(
        text(_FACTS),
        {
            "sessions": list(sessions),
            "last": max(last, len(sessions)),
            "leave_out": leave_out_group,
        },
    )
    return [TurnFacts(**row._mapping) for row in rows]


@dataclass(frozen=True)
class SessionSummary:
    session_id: str
    main: int
    side: int
    judged: int
    sampled: int
    trained: int
    with_skills: int = 0  # main calls that carried skills


def summarise(facts: Sequence[TurnFacts]) -> list[SessionSummary]:
    by_session: dict[str, list[TurnFacts]] = {}
    for f in facts:
        by_session.setdefault(f.session_id, []).append(f)
    out = []
    for session_id, turns in by_session.items():
        main = [f for f in turns if f.turn_type == "main"]
        out.append(
            SessionSummary(
                session_id,
                len(main),
                len(turns) - len(main),
                sum(f.judged for f in main),
                sum(f.sampled for f in main),
                sum(f.trained for f in main),
                sum(f.n_skills > 0 for f in main),
            )
        )
    return out
