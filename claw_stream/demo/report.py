"""A demo's tables (rich) and plot (matplotlib)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich.table import Table

from claw_stream.demo.tally import HeldOutAnswer, Tally, mean_words


def passes(max_words: int, wants: str = "short") -> str:
    """What passes the persona's rule, in words: the held-out column's title."""
    return f"share under {max_words} words" if wants == "short" else f"share of {max_words}+ words"


def tables(tally: Tally, max_words: int, wants: str = "short", title: str = "") -> list[Table]:
    """The live answers per version and, when scored, the held-out set per version (`title`:
    whose, where there are several)."""
    live = Table(
        "version",
        "answers",
        f"share under {max_words} words",
        "mean reward",
        title=f"{title}live answers per version (the persona's questions)",
    )
    for version, n, short, reward in tally.per_version():
        live.add_row(str(version), str(n), f"{short:.0%}", f"{reward:+.2f}")
    curve = tally.held_out_curve()
    if not curve:
        return [live]
    held = Table(
        "version",
        "answers",
        f"{passes(max_words, wants)} [95%]",
        f"win rate against v{curve[0].version} [95%]",
        "won / tied / lost",
        title=f"{title}held-out questions per version (never trained, same seed each version)",
    )
    for p in curve:
        w = p.against_first
        held.add_row(
            str(p.version),
            str(p.passed.n),
            f"{p.passed.value:.0%} [{p.passed.low:.0%}, {p.passed.high:.0%}]",
            f"{w.value:.0%} [{w.low:.0%}, {w.high:.0%}]" if w else "(baseline)",
            f"{w.wins} / {w.ties} / {w.losses}" if w else "",
        )
    return [live, held]


def plot(tally: Tally, path: Path, max_words: int) -> Path:
    """The held-out curve (when scored): each version's share of short answers with its 95%
    band, the first version's level and the trend; the live answers' shares beside it, faint:
    their counts differ per version and so does their noise."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = tally.per_version()
    curve = tally.held_out_curve()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    if curve:
        versions = [p.version for p in curve]
        shares = [p.passed.value for p in curve]
        ax.fill_between(
            versions,
            [p.passed.low for p in curve],
            [p.passed.high for p in curve],
            alpha=0.2,
            label="95% interval",
        )
        ax.plot(
            versions,
            shares,
            marker="o",
            label=f"held-out: share under {max_words} words ({curve[0].passed.n} questions)",
        )
        ax.axhline(shares[0], linestyle="--", color="grey", label=f"v{versions[0]} baseline")
        if len(curve) >= 4:
            ax.plot(
                versions,
                _moving_average(shares, 3),
                linestyle=":",
                color="black",
                label="trend (mean of 3 neighbouring versions)",
            )
        ax.set_ylim(-0.02, 1.02)
        ax.set_ylabel("share of short answers")
    if rows:
        ax.scatter(
            [r[0] for r in rows],
            [r[2] for r in rows],
            marker="x",
            color="tab:orange",
            alpha=0.5,
            label=f"live answers ({min(r[1] for r in rows)}-{max(r[1] for r in rows)} per version)",
        )
    ax.set_xlabel("policy version")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    ax.set_title(
        "claw-stream demo: held-out questions per version"
        if curve
        else "claw-stream demo: what the persona wants, per version"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)  # a data dir the demo is the first to use
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _moving_average(values: list[float], width: int) -> list[float]:
    """Each value averaged with its neighbours, `width` in all (fewer at the ends)."""
    half = width // 2
    windows = [values[max(0, i - half) : i + half + 1] for i in range(len(values))]
    return [sum(w) / len(w) for w in windows]


def plot_tenants(
    tallies: dict[str, Tally], shared: Sequence[HeldOutAnswer] | None, path: Path
) -> Path:
    """Each tenant's held-out answers per version of its own adapter: their mean length in
    words; the shared policy's (`shared`, its set before any training), as a line. Tenants of opposite tastes should part,
    each its own way, and the shared policy stay where it was."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, tally in tallies.items():
        versions = sorted(tally.held_out)
        if versions:
            words = [mean_words(tally.held_out[v]) for v in versions]
            ax.plot(versions, words, marker="o", label=f"{name}'s adapter")
    if shared:
        ax.axhline(
            mean_words(shared), linestyle="--", color="grey", label="shared policy (untrained)"
        )
    ax.set_xlabel("adapter version (v0: the shared policy, before any adapter)")
    ax.set_ylabel("held-out answers: mean words")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    ax.set_title("two tenants of opposite tastes, one base model: each adapter its own way")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
