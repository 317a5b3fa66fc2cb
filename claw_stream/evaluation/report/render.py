"""The learning report shown: rich tables in the terminal, a PNG (matplotlib) and one HTML page
that holds both, the plot inlined (jinja2), so it opens anywhere without the stack."""

from __future__ import annotations

import base64
from pathlib import Path

from jinja2 import Environment, PackageLoader, select_autoescape
from rich.table import Table

from claw_stream.evaluation.held_out import HeldOutPoint, verdict
from claw_stream.evaluation.intervals import WinRate
from claw_stream.evaluation.report.learning import LearningReport, VersionLine
from claw_stream.evaluation.report.replayed import ReplayLine


def versions_header() -> list[str]:
    return [
        "version",
        "status",
        "minutes after previous",
        "samples trained",
        "live turns",
        "judge -1 / 0 / +1 (unjudged)",
        "feedback up / down",
        "explicit rewards (mean)",
    ]


def version_cells(line: VersionLine) -> list[str]:
    votes = line.votes
    return [
        f"v{line.version}",
        line.status,
        f"{line.minutes_since_previous:.1f}" if line.minutes_since_previous is not None else "",
        str(line.samples_trained),
        str(line.turns),
        f"{votes.get(-1, 0)} / {votes.get(0, 0)} / {votes.get(1, 0)} ({line.unjudged})",
        f"{line.feedback_up} / {line.feedback_down}",
        f"{line.rewards} ({line.mean_reward:+.2f})" if line.mean_reward is not None else "0",
    ]


def held_out_header(curve: list[HeldOutPoint]) -> list[str]:
    return [
        "version",
        "items",
        "passed [95%]",
        f"win rate against v{curve[0].version} [95%]",
        "against the previous [95%]",
        "won / tied / lost (first)",
    ]


def held_out_cells(point: HeldOutPoint) -> list[str]:
    p, first = point.passed, point.against_first
    return [
        f"v{point.version}",
        str(p.n),
        f"{p.value:.0%} [{p.low:.0%}, {p.high:.0%}]",
        _rate(first) if first else "(baseline)",
        _rate(point.against_previous) if point.against_previous else "",
        f"{first.wins} / {first.ties} / {first.losses}" if first else "",
    ]


def replay_header() -> list[str]:
    return [
        "version",
        "scored by",
        "held-out turns",
        "won / tied / lost",
        "win rate against the users' answers [95%]",
    ]


def replay_cells(line: ReplayLine) -> list[str]:
    w = line.against_users
    rate = _rate(w) if line.reliable is not False else "unreliable judge (see the note)"
    return [
        f"v{line.version}",
        line.scorer,
        str(w.wins + w.ties + w.losses),
        f"{w.wins} / {w.ties} / {w.losses}",
        rate,
    ]


def waits_line(report: LearningReport) -> str:
    w = report.waits
    if not w.seconds:
        return f"feedback → a version trained on it: none served yet ({w.pending} waiting)"
    p50, p95 = w.percentile(50), w.percentile(95)
    assert p50 is not None and p95 is not None
    return (
        f"feedback → the first answer of a version trained on it: p50 {p50:.0f} s, "
        f"p95 {p95:.0f} s over {len(w.seconds)} feedback calls ({w.pending} still waiting)"
    )


def verdicts(report: LearningReport) -> list[str]:
    return [f"{source}: {verdict(curve)}" for source, curve in report.held_out.items()]


def tables(report: LearningReport) -> list[Table]:
    out = Table(
        *versions_header(),
        title=f"{report.policy}: versions ({report.scope})",
        title_justify="left",
    )
    for line in report.versions:
        out.add_row(*version_cells(line))
    result = [out]
    for source, curve in report.held_out.items():
        held = Table(
            *held_out_header(curve),
            title=f"held-out: {source} (never trained)",
            title_justify="left",
        )
        for point in curve:
            held.add_row(*held_out_cells(point))
        result.append(held)
    if report.replay.lines:
        replayed = Table(
            *replay_header(),
            title="held-out turns of real conversations, answered again (never trained)",
            title_justify="left",
        )
        for replayed_line in report.replay.lines:
            replayed.add_row(*replay_cells(replayed_line))
        result.append(replayed)
    return result


def plot(report: LearningReport, path: Path) -> Path:
    """Above, per held-out source: each version's pass share with its 95% band, and its win
    rate against the first version (dashed; one half: no better, no worse). Below: the judge's
    votes on live turns, per version."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True)
    for source, curve in report.held_out.items():
        xs = [p.version for p in curve]
        drawn = top.plot(
            xs,
            [p.passed.value for p in curve],
            marker="o",
            label=f"{source}: passed ({curve[0].passed.n} items)",
        )
        colour = drawn[0].get_color()
        top.fill_between(
            xs,
            [p.passed.low for p in curve],
            [p.passed.high for p in curve],
            alpha=0.15,
            color=colour,
        )
        later = [(p.version, p.against_first) for p in curve if p.against_first is not None]
        if later:
            top.plot(
                [v for v, _ in later],
                [w.value for _, w in later],
                linestyle="--",
                marker=".",
                color=colour,
                label=f"{source}: win rate against v{curve[0].version}",
            )
    for served, to in report.rollbacks:
        top.axvline(served, color="tab:red", alpha=0.6)
        top.annotate(
            f"rolled back to v{to}", (served, 0.95), fontsize=8, color="tab:red", ha="right"
        )
    top.axhline(0.5, linestyle=":", color="grey")
    top.set_ylim(-0.02, 1.02)
    top.set_ylabel("held-out (never trained)")
    top.grid(alpha=0.3)
    if report.held_out:
        top.legend(fontsize=8, loc="best")
    else:
        top.text(0.5, 0.5, "no held-out scores yet", ha="center", transform=top.transAxes)
    xs = [line.version for line in report.versions]
    below = [0.0] * len(xs)
    for vote, colour in ((-1, "tab:red"), (0, "tab:grey"), (1, "tab:green")):
        heights = [float(line.votes.get(vote, 0)) for line in report.versions]
        bottom.bar(xs, heights, bottom=below, color=colour, label=f"judge {vote:+d}")
        below = [b + h for b, h in zip(below, heights, strict=True)]
    if any(below):
        bottom.legend(fontsize=8, loc="best")
    else:
        bottom.text(0.5, 0.5, "no live turn judged yet", ha="center", transform=bottom.transAxes)
    bottom.set_ylabel("live turns judged")
    bottom.set_xlabel("policy version")
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    bottom.grid(alpha=0.3)
    fig.suptitle(f"claw-stream report: {report.policy} ({report.scope})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def page(report: LearningReport, png: Path, path: Path) -> Path:
    environment = Environment(
        loader=PackageLoader("claw_stream.evaluation.report", "."),
        autoescape=select_autoescape(["html", "j2"]),
    )
    html = environment.get_template("page.html.j2").render(
        report=report,
        plot=base64.b64encode(png.read_bytes()).decode(),
        versions_header=versions_header(),
        versions=[version_cells(line) for line in report.versions],
        held_out=[
            (source, held_out_header(curve), [held_out_cells(p) for p in curve])
            for source, curve in report.held_out.items()
        ],
        waits=waits_line(report),
        verdicts=verdicts(report),
        replay_header=replay_header(),
        replay=[replay_cells(line) for line in report.replay.lines],
    )
    path.write_text(html, encoding="utf-8")
    return path


def _rate(w: WinRate) -> str:
    return f"{w.value:.0%} [{w.low:.0%}, {w.high:.0%}]"


def write(report: LearningReport, folder: Path) -> tuple[Path, Path]:
    """`report.png` and `report.html` (the plot inlined) in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    png = plot(report, folder / "report.png")
    return png, page(report, png, folder / "report.html")
