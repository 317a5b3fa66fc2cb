"""The held-out replay's pure parts: which turns are held out, the judge's prompt and votes in
both orders, a rule's pair score, the judge's agreement with a rule, the report's replay
section, the replay as a gated promotion criterion, and its metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest
from rich.console import Console

from claw_stream.evaluation.records import EvalMetrics
from claw_stream.evaluation.replay.pairs import (
    CLIP_CHARS,
    HeldOutTurn,
    agreement,
    judged,
    pair_messages,
    parse_preference,
    rule_pair,
    vote_score,
)
from claw_stream.evaluation.replay.records import next_state
from claw_stream.evaluation.report import render
from claw_stream.evaluation.report.learning import ReportRows, build
from claw_stream.evaluation.report.replayed import ReplayRow, replay_section
from claw_stream.gateway.capture import step_request
from claw_stream.ids import is_held_out, uuid7
from claw_stream.versions.promotion import Verdict, both, judge_replay

from ..support.paths import AGENTS


def turn(
    answer: str = "A long answer.", after: str | None = "[user] Shorter, please."
) -> HeldOutTurn:
    request = {
        "messages": [
            {"role": "system", "content": "Be kind."},
            {"role": "user", "content": "What is a star?"},
        ]
    }
    return HeldOutTurn(uuid7(), "s1", "k1", 3, request, answer, after)


def test_a_stable_tenth_of_the_turns_is_held_out() -> None:
    ids = [uuid7() for _ in range(20_000)]
    held = [i for i in ids if is_held_out(i, 0.1)]
    assert 0.09 < len(held) / len(ids) < 0.11
    assert held == [i for i in ids if is_held_out(i, 0.1)]  # the same turns every time
    assert not any(is_held_out(i, 0.0) for i in ids[:1000])
    # a larger share holds out a superset: raising it never trains a turn held out before
    assert set(held) <= {i for i in ids if is_held_out(i, 0.3)}


def test_the_judge_sees_both_answers_and_what_the_user_said_next() -> None:
    t = turn()
    first = pair_messages(t, "Hot gas.", "new_first")[1]["content"]
    second = pair_messages(t, "Hot gas.", "old_first")[1]["content"]
    assert "What is a star?" in first and "Be kind." not in first  # no system prompt
    assert first.index("Hot gas.") < first.index("A long answer.")
    assert second.index("A long answer.") < second.index("Hot gas.")
    assert "Shorter, please." in first
    # the answer the user got is named, in each order
    assert "given answer B" in first and "given answer A" in second
    ended = pair_messages(turn(after=None), "Hot gas.", "new_first")[1]["content"]
    assert "the conversation ended there" in ended


def test_votes_in_both_orders_cancel_a_judge_that_always_names_a() -> None:
    assert parse_preference("A") == "A" and parse_preference(" b.") == "B"
    assert parse_preference("Tie") == "tie" and parse_preference("B is better") == "B"
    assert parse_preference("A: A\n") == "A" and parse_preference("Answer B") == "B"
    # what SmolLM2-135M wrote: an article, and the options read back, name no answer
    assert parse_preference("A black hole is") is None
    assert parse_preference("A, B or TIE.") is None
    assert parse_preference("I think: B") is None and parse_preference("") is None
    assert vote_score("A", "new_first") == 1.0 and vote_score("A", "old_first") == 0.0
    assert vote_score("B", "old_first") == 1.0 and vote_score("tie", "old_first") == 0.5
    assert judged([("A", "new_first"), ("A", "old_first")]) == (0.5, 2)  # position bias: a tie
    assert judged([("A", "new_first"), ("B", "old_first")]) == (1.0, 2)  # the new one, twice
    assert judged([(None, "new_first"), ("A", "old_first")]) == (0.0, 1)
    assert judged([(None, "new_first")]) == (None, 0)


def test_a_rule_scores_the_pair_and_the_judge_agreement_is_measured() -> None:
    assert rule_pair(1.0, 0.0) == 1.0 and rule_pair(0.0, 1.0) == 0.0 and rule_pair(1, 1) == 0.5
    # a judge that always ties agrees with the rule on none of the pairs the rule decided
    tied = agreement("smol", [(1.0, 0.5)] * 30 + [(0.5, 0.5)] * 10)
    assert tied.agreed.n == 30 and tied.agreed.k == 0 and not tied.reliable
    coin = agreement("coin", [(1.0, 1.0), (1.0, 0.0)] * 15)
    assert coin.agreed.value == 0.5 and not coin.reliable  # a coin is no better than chance
    good = agreement("big", [(1.0, 1.0)] * 18 + [(0.0, 0.0)] * 10 + [(1.0, 0.0)] * 2)
    assert good.reliable and "28 of 30" in good.words()
    # a judge whose answers named no option agrees with nothing
    mute = agreement("mute", [(1.0, None)] * 8 + [(0.5, None)] * 4)
    assert mute.agreed.n == 8 and mute.agreed.k == 0 and not mute.reliable


def test_the_next_state_is_what_came_after_the_answer() -> None:
    prompt = [{"role": "user", "content": "hi"}]
    answer = {"role": "assistant", "content": "hello"}
    step = {"request": {"messages": prompt}, "response": {"message": answer}}
    following = {
        "request": {"messages": [*prompt, answer, {"role": "user", "content": "too long"}]}
    }
    assert next_state(step, following) == "[user] too long"
    # a client that rewrote its history: what follows its last assistant message
    summary = {"role": "user", "content": "summary"}
    compacted = {"request": {"messages": [summary, {"role": "user", "content": "then: why?"}]}}
    assert next_state(step, compacted) == "[user] summary\n[user] then: why?"
    assert next_state(step, None) is None


def row(
    version: int, scorer: str, score: float, rule: float | None, judge: float | None
) -> ReplayRow:
    return ReplayRow(version, scorer, score, rule, judge, "smol" if judge is not None else None)


def test_the_report_hides_the_win_rate_of_a_judge_no_better_than_a_coin(tmp_path: Path) -> None:
    rows = [row(4, "rule:persona", 1.0, 1.0, 0.5) for _ in range(12)]  # the judge always ties
    rows += [row(5, "judge:smol", 1.0, None, 1.0) for _ in range(6)]
    section = replay_section(rows)
    assert [(line.version, line.scorer) for line in section.lines] == [
        (4, "rule:persona"),
        (5, "judge:smol"),
    ]
    persona, judged_line = section.lines
    assert persona.against_users.wins == 12 and persona.reliable is None
    assert judged_line.reliable is False
    assert "unreliable" in render.replay_cells(judged_line)[-1]
    assert render.replay_cells(persona)[-1].startswith("100% [")
    assert any("smol is unreliable" in n and "--judge-url" in n for n in section.notes)

    report = build(ReportRows("policy", "all sessions", [], {}, [], [], {}, [], rows))
    assert any("--judge-url" in note for note in report.notes)
    console = Console(record=True, width=200)
    for table in render.tables(report):
        console.print(table)
    assert "held-out turns of real conversations" in console.export_text()
    _, page = render.write(report, tmp_path)
    assert 'id="replay"' in page.read_text()


def test_a_judge_never_checked_against_a_rule_is_shown_with_a_warning() -> None:
    section = replay_section([row(2, "judge:big", 0.0, None, 0.0)])
    assert section.lines[0].reliable is None
    assert section.lines[0].against_users.losses == 1
    assert any("not measured" in n for n in section.notes)


def test_gated_promotion_needs_the_replay_too() -> None:
    task = Verdict(True, "v3 scored 0.5 >= 0.5")
    lost = judge_replay([0.0, 0.0, 0.5, 1.0], 0.1, 3)  # 37.5% < 40%
    assert not lost.promote and "of 4 held-out turns" in lost.reason
    assert judge_replay([0.5, 0.5], 0.1, 3).promote  # ties: no worse than the users' answers
    assert both(task, None) == task
    combined = both(task, lost)
    assert (
        not combined.promote and task.reason in combined.reason and lost.reason in combined.reason
    )


def test_the_replay_is_on_metrics() -> None:
    metrics = EvalMetrics()
    metrics.observe_replay("policy", 7, "judge:smol", [1.0, 0.5, 0.0, 0.75])
    text = generate_latest(metrics.registry).decode()
    assert 'claw_eval_replay_win_rate{policy="policy",scorer="judge:smol"} 0.625' in text
    assert 'claw_eval_replay_pairs_total{outcome="win",policy="policy"} 2.0' in text
    assert 'claw_eval_replay_version{policy="policy"} 7.0' in text


def test_the_next_state_and_the_judges_prompt_of_a_real_openclaw_conversation() -> None:
    """OpenClaw's recorded small-profile session: the user's next words follow the answer,
    after its compaction too (the rewritten history kept the last answer; tests/unit/
    test_next_state.py reads every turn); the judge's prompt stays within a small judge's
    window whatever OpenClaw's system prompt holds."""
    lines = (AGENTS / "openclaw" / "small-profile-session.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    main = [r for r in records if r["body"].get("tools")]  # the conversation's own calls
    first, resumed = main[0]["body"], main[-1]["body"]
    assert len(resumed["messages"]) < len(main[-2]["body"]["messages"])  # compacted before it

    def archived(record: dict[str, Any]) -> dict[str, Any]:
        answer = {"role": "assistant", "content": record["answer"]}
        return {"request": step_request(record["body"]), "response": {"message": answer}}

    said = next_state(archived(main[0]), archived(main[1]))
    assert said is not None and said.startswith("[user]") and "Thanks, that is right." in said
    after_compaction = next_state(archived(main[-2]), archived(main[-1]))
    assert after_compaction == f"[user] {resumed['messages'][-1]['content']}"

    answer = "Paris is the capital of France."
    t = HeldOutTurn(uuid7(), "openclaw-s1", None, 0, first, answer, said)
    prompt = pair_messages(t, "Paris.", "new_first")[1]["content"]
    system = first["messages"][0]["content"]
    assert len(system) > 7_000 and system[:200] not in prompt  # its system prompt left out
    assert "What is the capital of France?" in prompt and len(prompt) < 4 * CLIP_CHARS
