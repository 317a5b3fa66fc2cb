"""A session's steps into turns: main or side, each main step's turn with its next state (the
contract's one rule, `claw_stream.next_state`), token drift, close reasons, when a batch
stitches in one pass, and which turns are held out for the held-out replay."""

from __future__ import annotations

import heapq
import itertools
import uuid
from datetime import UTC, datetime
from typing import Literal

from claw_stream.events import SessionEvent, Step, Turn
from claw_stream.ids import derive_uuid7, is_held_out
from claw_stream.next_state import next_state, same_answer


def token_drift(previous: Step, step: Step) -> str | None:
    """Where `step`'s prompt ids part from `previous`'s prompt + answer ids although its
    messages continue `previous`'s messages and answer; None where they agree, or where the
    conversation does not say they should (history rewritten, no ids: a masked prompt).

    The ids compared are the gateway's own records of what the engine read and sampled, never
    a re-tokenisation: a part means the engine's chat template rendered the earlier answer
    otherwise than it was sampled (thinking dropped, a tool call reformatted, a sampled token
    split that encoding would merge), so the turn's prompt is not the conversation the policy
    lived through."""
    before = previous.request.messages
    messages = step.request.messages
    if (
        len(messages) <= len(before)
        or not previous.prompt_token_ids
        or not step.prompt_token_ids
        or messages[: len(before)] != before
        or not same_answer(messages[len(before)], previous.response.message)
    ):
        return None
    expected = [*previous.prompt_token_ids, *previous.response_token_ids]
    got = step.prompt_token_ids[: len(expected)]
    if got == expected:
        return None
    at = next((i for i, (a, b) in enumerate(zip(expected, got, strict=False)) if a != b), len(got))
    where = "in the answer" if at >= len(previous.prompt_token_ids) else "in the prompt"
    return (
        f"token_drift: prompt ids part from the previous turn's prompt + answer ids at "
        f"{at} of {len(expected)} ({where})"
    )


def drifts_of(line: list[Step], settled: set[uuid.UUID]) -> dict[uuid.UUID, str]:
    """`token_drift` of each main step after the first, by step id, but for the `settled`
    ones (whose turns were emitted: their drift was found when they were new)."""
    return {
        step.step_id: drift
        for before, step in itertools.pairwise(line)
        if turn_id_of(step) not in settled and (drift := token_drift(before, step))
    }


CloseReason = Literal["session_ended", "refreshed", "done", "idle_timeout"]


def close_reason(kind: str, reason: str | None) -> CloseReason:
    """The turn-level reason for a SessionEvent that ends a session."""
    if kind == "refreshed":
        return "refreshed"
    if reason in ("done", "idle_timeout"):
        return reason  # type: ignore[return-value]
    return "session_ended"


def stitched_together(events: list[Step | SessionEvent], closed: bool) -> bool:
    """Whether a session's records of a batch can be stitched in one pass beside other
    sessions' records: its open segment stays the one open for all of them (it is open now and
    no step comes after an end, which may close it), with at most one end and no episode
    reward (which asks for the closed segment's assembly again)."""
    if closed:
        return False
    ended = False
    for event in events:
        if isinstance(event, Step):
            if ended:
                return False
        elif event.kind in ("ended", "refreshed"):
            if ended:
                return False
            ended = True
        elif event.kind == "reward" and event.step_id is None:
            return False
    return True


def in_time_order(events: list[Step | SessionEvent]) -> list[Step | SessionEvent]:
    """A session's records of one batch with its steps and its session events merged by
    `created_at`, each topic's own order kept (on a tie the step first). The two come from
    different topics, and a batch holds them in whatever order the partitions were fetched:
    in bench/pipeline_bench.py a session's `ended` came before its own steps in most batches,
    which sent the session down the one-record-at-a-time path (a step after an end may open a
    new segment) and cost ~13% of the worker's CPU at 10 sessions/s."""
    steps = [e for e in events if isinstance(e, Step)]
    if len(steps) in (0, len(events)):
        return events
    others = [e for e in events if not isinstance(e, Step)]
    return list(heapq.merge(steps, others, key=lambda e: e.created_at))


def turn_id_of(step: Step) -> uuid.UUID:
    return derive_uuid7(step.step_id, "turn")


def main_line(steps: list[Step]) -> list[Step]:
    """A session's main-line steps in turn order, each step id once."""
    unique = {s.step_id: s for s in steps}
    return sorted(
        (s for s in unique.values() if s.turn_type == "main"),
        key=lambda s: (s.turn_index, s.created_at, s.step_id),
    )


def stitch_session(
    steps: list[Step],
    *,
    closed: CloseReason | None = None,
    now: datetime | None = None,
    reorder_grace_s: float = 30.0,
    arrived_at: dict[uuid.UUID, datetime] | None = None,
    settled_through: int = -1,
    segment: int | None = None,
    segments: dict[uuid.UUID, int] | None = None,
) -> list[Turn]:
    """Every turn a session's steps determine so far, in order (deterministic ids).

    Main step k becomes a turn when the next main step is known and no turn index between them
    is missing (a missing index may be a main step still in flight, e.g. spooled by another
    gateway replica). A gap is waited for `reorder_grace_s` after the later step arrived, then
    taken as a call that produced no step (an upstream error). With `closed`, the gaps are no
    longer waited for and the last main step becomes a turn without a next state.

    `settled_through`: turn indexes up to it belong to closed segments, so none is waited for.
    Each turn carries its step's segment (`segments`, else `segment`).
    """
    now = now or datetime.now(UTC)
    arrived_at = arrived_at or {}
    segments = segments or {}
    line = main_line(steps)
    present = {s.turn_index for s in steps}

    def segment_of(step: Step) -> int | None:
        return segments.get(step.step_id, segment)

    turns: list[Turn] = []
    for k, step in enumerate(line):
        if k + 1 == len(line):
            if closed is not None:
                turns.append(
                    Turn(
                        turn_id=turn_id_of(step),
                        session_id=step.session_id,
                        step=step,
                        closed_reason=closed,
                        is_last=True,
                        segment=segment_of(step),
                    )
                )
            break
        following = line[k + 1]
        gap = any(
            i not in present and i > settled_through
            for i in range(step.turn_index + 1, following.turn_index)
        )
        if gap and closed is None:
            seen = arrived_at.get(following.step_id, following.created_at)
            if (now - seen).total_seconds() < reorder_grace_s:
                break
        state = next_state(step.response.message, following.request.messages)
        turns.append(
            Turn(
                turn_id=turn_id_of(step),
                session_id=step.session_id,
                step=step,
                next_state=state.messages if state else None,
                next_step_id=following.step_id,
                closed_reason="next_step" if state else "superseded",
                segment=segment_of(step),
            )
        )
    return turns


# --- main or side: calls that do not extend the session's main line -----------------------

Classified = Literal["header", "first", "extends", "same_prompt", "other_prompt"]


def _system_prompt(step: Step) -> str | None:
    first = step.request.messages[0]
    return first.content if first.role in ("system", "developer") else None


def _tool_names(step: Step) -> frozenset[str]:
    names = set()
    for tool in step.request.tools or []:
        function = tool.get("function") if isinstance(tool, dict) else None
        names.add(str((function or {}).get("name") or tool.get("name") or ""))
    return frozenset(names)


def classify(step: Step, line: list[Step], header: bool = False) -> tuple[str, Classified]:
    """(turn type, why) of a step given the session's main line so far (its main steps).

    A header (`X-Turn-Type`), when the client sent one, wins; `header` says it did (a Step
    from before `turn_type_source` existed says 'side' only by header, so 'side' always wins).
    Otherwise a call is main when it is the session's first, when its messages carry an answer
    of the main line (it extends it: the usual next turn or tool round trip), or when it has
    the main line's system prompt and tools (the agent re-asked a turn or rewrote its history,
    e.g. after compaction). A call with another system prompt or other tools that extends
    nothing (context compaction, memory flush, title, a sub-agent) is a side turn.
    """
    if header or step.turn_type == "side":
        return step.turn_type, "header"
    earlier = [s for s in line if s.step_id != step.step_id]
    if not earlier:
        return "main", "first"
    messages = step.request.messages
    for main in reversed(earlier):
        answer = main.response.message
        if any(same_answer(m, answer) for m in messages):
            return "main", "extends"
    anchor = earlier[-1]
    if _system_prompt(step) == _system_prompt(anchor) and _tool_names(step) == _tool_names(anchor):
        return "main", "same_prompt"
    return "side", "other_prompt"


def held_out(turn: Turn, share: float) -> bool:
    """A trainable turn outside any group chosen for the held-out replay (`eval.holdout_share`):
    never judged or trained. A group's turns train whole (GRPO), and tasks have held-out sets
    of their own."""
    return turn.step.train and turn.step.group_id is None and is_held_out(turn.turn_id, share)
