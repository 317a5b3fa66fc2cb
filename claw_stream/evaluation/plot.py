"""A plot of the eval score per policy version (matplotlib, as the demo's)."""

from __future__ import annotations

from pathlib import Path


def plot_scores(rows: list[tuple[int, float]], path: Path, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([v for v, _ in rows], [s for _, s in rows], marker="o", label="held-out pass rate")
    ax.set_xlabel("policy version")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(title or "claw-stream eval: score per version")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
