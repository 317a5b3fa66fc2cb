"""The demo's held-out curve: each version against the first on the same questions."""

from __future__ import annotations

from pathlib import Path

from claw_stream.demo.report import plot, tables
from claw_stream.demo.tally import HeldOutAnswer, Tally


def _set(version: int, shorts: list[bool]) -> list[HeldOutAnswer]:
    return [HeldOutAnswer(i, version, 10 if s else 60, s) for i, s in enumerate(shorts)]


def test_the_last_version_beats_the_first_only_beyond_the_interval() -> None:
    tally = Tally()
    tally.held_out[0] = _set(0, [False] * 20 + [True] * 4)
    tally.held_out[3] = _set(3, [False] * 18 + [True] * 6)
    tally.held_out[7] = _set(7, [True] * 24)
    curve = tally.held_out_curve()
    assert [p.version for p in curve] == [0, 3, 7]
    assert curve[0].against_first is None and curve[0].passed.k == 4
    v3, v7 = curve[1].against_first, curve[2].against_first
    assert v3 is not None and v7 is not None
    assert not v3.beats  # 2 more short answers out of 24: within the noise
    assert v7.beats and (v7.wins, v7.ties, v7.losses) == (20, 4, 0)
    assert tally.verdict().startswith("v7 beats v0 beyond the interval: win rate 92%")

    tally.held_out.pop(7)
    assert tally.verdict().startswith("v3 does not beat v0 beyond the interval")


def test_one_version_has_nothing_to_compare() -> None:
    tally = Tally()
    tally.held_out[0] = _set(0, [True, False])
    assert "nothing to compare" in tally.verdict()


def test_the_tables_and_the_plot_show_the_held_out_curve(tmp_path: Path) -> None:
    tally = Tally()
    for v, k in ((0, 4), (2, 9), (4, 15), (6, 22)):
        tally.held_out[v] = _set(v, [True] * k + [False] * (24 - k))
    live, held = tables(tally, 30)
    assert held.row_count == 4 and live.row_count == 0
    path = plot(tally, tmp_path / "demo.png", 30)
    assert path.stat().st_size > 10_000 and path.read_bytes()[:4] == b"\x89PNG"
