"""The learning report put together from its rows (no database): which version a trainer step
went into, the live columns per version, the held-out curves, and the feedback waits."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from rich.console import Console

from claw_stream.evaluation.held_out import held_out_curve, verdict
from claw_stream.evaluation.report import render
from claw_stream.evaluation.report.learning import (
    Feedback,
    LiveTurn,
    ReportRows,
    VersionRow,
    Waits,
    build,
)

T0 = datetime(2026, 11, 28, 6, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def rows(**changes: object) -> ReportRows:
    base = {
        "policy": "policy",
        "scope": "all sessions",
        # pushed every second step: v1 holds steps 1-2, v2 steps 3-4; v3 was rejected
        "versions": [
            VersionRow(1, "ready", 2, at(120)),
            VersionRow(2, "ready", 4, at(300)),
            VersionRow(3, "rejected", 6, at(400)),
        ],
        "trained_per_step": {1: 4, 2: 4, 3: 2, 4: 2, 5: 1},
        "turns": [
            LiveTurn(0, 1, 1, None),
            LiveTurn(0, -1, -1, None),
            LiveTurn(0, None, None, 0.5),
            LiveTurn(1, 1, 1, 1.0),
        ],
        "feedback": [
            Feedback(at(10), 1),  # into v1, first served at 130 s
            Feedback(at(20), 2),
            Feedback(at(200), 3),  # into v2, served at 310 s
            Feedback(at(250), 5),  # into no served version yet (v3 was rejected)
            Feedback(at(260), None),  # not trained yet
        ],
        "first_served": {0: at(0), 1: at(130), 2: at(310)},
        "held_out": [
            *(("persona", 0, f"q{i}", 0.0) for i in range(4)),
            *(("persona", 1, f"q{i}", float(i < 2)) for i in range(4)),
            *(("persona", 2, f"q{i}", float(i < 3)) for i in range(4)),
        ],
    }
    return ReportRows(**{**base, **changes})  # type: ignore[arg-type]


def test_trainer_steps_count_in_the_version_that_holds_them() -> None:
    report = build(rows())
    trained = {line.version: line.samples_trained for line in report.versions}
    # step 5 sits only in the rejected v3: it never served, so it counts nowhere
    assert trained == {0: 0, 1: 8, 2: 4, 3: 0}
    minutes = {line.version: line.minutes_since_previous for line in report.versions}
    assert minutes == {0: None, 1: None, 2: 3.0, 3: 100 / 60}
    assert [line.status for line in report.versions] == ["base", "ready", "ready", "rejected"]


def test_live_turns_per_version_with_votes_feedback_and_rewards() -> None:
    v0 = build(rows()).versions[0]
    assert (v0.turns, v0.votes, v0.unjudged) == (3, {1: 1, -1: 1}, 1)
    assert (v0.feedback_up, v0.feedback_down, v0.rewards, v0.mean_reward) == (1, 1, 1, 0.5)


def test_feedback_waits_until_a_version_trained_on_it_serves() -> None:
    waits = build(rows()).waits
    assert sorted(waits.seconds) == [110.0, 110.0, 120.0]
    assert waits.pending == 2  # trained into a rejected version; not trained at all
    assert waits.percentile(50) == 110.0
    assert Waits([], 3).percentile(50) is None
    assert Waits([5.0], 0).percentile(95) == 5.0
    p95 = Waits([float(s) for s in range(1, 101)], 0).percentile(95)
    assert p95 is not None and 94 < p95 < 96


def test_held_out_curves_pair_items_against_the_first_and_the_previous() -> None:
    curve = build(rows()).held_out["persona"]
    assert [p.version for p in curve] == [0, 1, 2]
    assert [p.passed.k for p in curve] == [0, 2, 3]
    first, previous = curve[2].against_first, curve[2].against_previous
    assert first is not None and (first.wins, first.ties, first.losses) == (3, 1, 0)
    assert previous is not None and (previous.wins, previous.ties, previous.losses) == (1, 3, 0)
    assert curve[0].against_first is None and curve[0].against_previous is None


def test_the_report_says_when_there_is_nothing_held_out() -> None:
    report = build(rows(held_out=[], versions=[], turns=[], feedback=[], trained_per_step={}))
    assert [line.version for line in report.versions] == [0]
    assert report.held_out == {} and report.notes and "claw-stream demo" in report.notes[0]
    assert "none served yet" in render.waits_line(report)


def test_tables_png_and_a_self_contained_page(tmp_path: Path) -> None:
    report = build(rows())
    console = Console(record=True, width=220)
    for table in render.tables(report):
        console.print(table)
    text = console.export_text()
    assert "policy: versions" in text and "held-out: persona" in text
    assert "75% [30%, 95%]" in text  # v2: 3 of 4 passed, with Wilson's interval
    assert "v2 beats v0" not in " ".join(render.verdicts(report))  # 4 items: not beyond noise
    assert "p50 110 s" in render.waits_line(report)
    png, html = render.write(report, tmp_path / "out")
    assert png.read_bytes()[:4] == b"\x89PNG"
    page = html.read_text()
    assert 'src="data:image/png;base64,' in page and "<script" not in page
    assert page.count('<table class="held-out">') == 1 and '<table id="versions">' in page
    assert "p50 110 s" in page


def test_a_rollback_shows_in_the_status_and_says_why() -> None:
    versions = [
        VersionRow(1, "ready", 2, at(600), rolled_back_from=2, reason="watchdog: v2 lost to v1"),
        VersionRow(2, "ready", 4, at(300)),
    ]
    report = build(rows(versions=versions))
    status = {line.version: line.status for line in report.versions}
    assert status[1] == "ready, rolled back to from v2" and status[2] == "ready"
    assert "v1 served again at 06:10:00, rolled back from v2: watchdog: v2 lost to v1" in (
        report.notes
    )
    minutes = {line.version: line.minutes_since_previous for line in report.versions}
    assert minutes[1] is None  # its ready time is the rollback's
    assert report.rollbacks == [(2, 1)]


def test_the_verdict_takes_the_newest_version_scored_on_the_whole_set() -> None:
    items = [f"t{i}" for i in range(20)]
    curve = held_out_curve(
        {
            0: {i: 0.0 for i in items},
            1: {i: 1.0 for i in items},  # whole, and better on all 20
            2: {i: 0.0 for i in items[:2]},  # came mid-run: 2 items only
        }
    )
    said = verdict(curve)
    assert said.startswith("v1 beats v0 beyond the interval") and "on 20 held-out items" in said


def test_feedback_held_by_a_version_never_served_waits_for_the_next_one_served() -> None:
    # v2 holds step 3, but no call was ever answered by v2; v3 and v4 hold it too, and v4
    # answered first
    waits = build(
        rows(
            versions=[VersionRow(1, "ready", 2, at(120)), VersionRow(2, "ready", 4, at(300))],
            feedback=[Feedback(at(200), 3)],
            first_served={0: at(0), 1: at(130), 3: at(500), 4: at(450)},
        )
    ).waits
    assert waits.seconds == [250.0] and waits.pending == 0  # v4's first answer, at 450 s
