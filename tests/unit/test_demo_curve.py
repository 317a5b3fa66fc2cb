"""The demo's held-out curve: each version against the first on the same questions."""

from __future__ import annotations

from pathlib import Path

from claw_stream.demo.persona import Persona
from claw_stream.demo.report import plot, plot_tenants, tables
from claw_stream.demo.tally import HeldOutAnswer, Tally


def _set(version: int, shorts: list[bool]) -> list[HeldOutAnswer]:
    return [HeldOutAnswer(i, version, 10 if s else 60, s, s) for i, s in enumerate(shorts)]


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


def test_a_persona_who_wants_long_answers_passes_the_long_ones() -> None:
    long_, short, empty = " ".join(["word"] * 40), "Light bends in drops.", ""
    wants_long, wants_short = Persona(30, "long"), Persona(30)
    assert wants_long.likes(long_) and not wants_long.likes(short)
    assert wants_short.likes(short) and not wants_short.likes(long_)
    assert not wants_long.likes(empty) and not wants_short.likes(empty)
    assert "too short" in wants_long.reply(False) and "too long" in wants_short.reply(False)

    # its held-out curve counts what it likes: fewer short answers is its progress
    tally = Tally()
    tally.held_out[0] = [HeldOutAnswer(i, 0, 10, True, False) for i in range(12)]
    tally.held_out[5] = [HeldOutAnswer(i, 5, 40, False, True) for i in range(12)]
    assert tally.verdict("answers it likes").startswith("v5 beats v0 beyond the interval")
    assert {s.score for s in tally.item_scores() if s.version == 5} == {1.0}
    _, held = tables(tally, 30, "long", title="bob: ")
    assert held.columns[2].header == "share of 30+ words [95%]"
    assert str(held.title).startswith("bob: held-out")


def test_the_tenants_plot_draws_each_adapter_and_the_shared_policy(tmp_path: Path) -> None:
    alice, bob = Tally(), Tally()
    for v in range(4):
        alice.held_out[v] = _set(v, [True] * (6 * v) + [False] * (24 - 6 * v))
        bob.held_out[v] = _set(v, [True] * (6 - 2 * v) + [False] * (18 + 2 * v))
    shared = _set(0, [True] * 6 + [False] * 18)
    path = plot_tenants({"alice": alice, "bob": bob}, shared, tmp_path / "t.png")
    assert path.stat().st_size > 10_000 and path.read_bytes()[:4] == b"\x89PNG"


def test_skills_are_scored_against_the_first_version_without_them() -> None:
    tally = Tally()
    assert "not asked both" in tally.skills_verdict()
    tally.held_out[0] = _set(0, [False] * 24)
    tally.held_out_skills[0] = _set(0, [True] * 16 + [False] * 8)
    assert tally.skills_verdict().startswith(
        "v0 with skills beats v0 without beyond the interval: win rate 83%"
    )
    assert "(16 won, 8 tied, 0 lost); short answers 0% -> 67%" in tally.skills_verdict()
    tally.held_out_skills[0] = _set(0, [True] * 3 + [False] * 21)
    assert tally.skills_verdict().startswith("v0 with skills does not beat v0 without")
    sources = {(s.source, s.version) for s in tally.item_scores()}
    assert sources == {("persona", 0), ("persona+skills", 0)}
