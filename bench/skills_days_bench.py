"""Several users of different tastes over several days: how much each one likes the answers,
day by day, with and without skills, on one embedded stack (SmolLM2-135M on CPU).

Users: `short` (answers under 30 words), `long` (30 words or more), `list` (a bulleted list),
`plain` (no list, no markdown). Each user plays `--episodes` two-answer episodes a day (thumbs
on each answer, and when it dislikes one it says what it wants: "That is too long. Please
answer in under 30 words."), as two people: one whose calls carry their skills (`skills`),
one whose calls never do (`none`, `X-Claw-Skills: off`). Between days the bench waits until
the worker has kept the `skills` user's lessons of that day. Each user is a tenant of its own,
so one's skills never reach another.

`--learn weights` or `both` run the trainer too (the shared policy learns from every user at
once: opposite tastes pull it both ways), and between days the bench waits until every sample
so far is trained and served ("overnight"), so the shares do not depend on the machine's speed;
the default, `skills`, runs without one.

Prints the liked share per user, condition and day with its 95% interval, and plots it.
Run: python bench/skills_days_bench.py [--days 3] [--episodes 4] [--plot skills-days.png]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import httpx
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.stack import new_stack, running  # noqa: E402
from claw_stream.demo.persona import Persona, play_episode  # noqa: E402
from claw_stream.demo.run import wait_for_skills  # noqa: E402
from claw_stream.evaluation.intervals import Share, wilson  # noqa: E402
from claw_stream.names import policy_model  # noqa: E402

_LIST_LINE = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+", re.MULTILINE)


@dataclass(frozen=True)
class ListTaste(Persona):
    """Wants a bulleted list (at least two items), or wants none (`plain`)."""

    list_wanted: bool = True

    def likes(self, answer: str) -> bool:
        items = len(_LIST_LINE.findall(answer))
        has_list = items >= 2
        if not answer.strip():
            return False
        return has_list if self.list_wanted else not has_list and "**" not in answer

    def reply(self, liked: bool) -> str:
        if liked:
            return "Thanks, that is how I like it."
        if self.list_wanted:
            return "That is not how I like it. Please answer as a bulleted list."
        return "That is not how I like it. Please answer in plain sentences, without lists."


TASTES: dict[str, Persona] = {
    "short": Persona(30, "short"),
    "long": Persona(30, "long"),
    "list": ListTaste(list_wanted=True),
    "plain": ListTaste(list_wanted=False),
}
CONDITIONS = ("none", "skills")


async def one_day(
    gateway: str, admin: str, model: str, day: int, episodes: int, seed: int
) -> dict[tuple[str, str], list[bool]]:
    """Every user's episodes of one day, all at once: what each liked."""
    liked: dict[tuple[str, str], list[bool]] = {}

    async def play(taste: str, condition: str) -> None:
        rng = random.Random(f"{seed}-{taste}-{condition}-{day}")
        persona = TASTES[taste]
        answers = []
        for _ in range(episodes):
            answers += await play_episode(
                gateway,
                admin,
                model,
                persona,
                rng,
                tenant=f"{taste}-{condition}",
                skills=condition == "skills",
            )
        liked[taste, condition] = [a.reward > 0 for a in answers]

    await asyncio.gather(*(play(t, c) for t in TASTES for c in CONDITIONS))
    return liked


async def lessons_kept(gateway: str, admin: str, tastes: list[str]) -> None:
    await asyncio.gather(*(wait_for_skills(gateway, admin, f"{t}-skills", 60) for t in tastes))


async def trained_overnight(dsn: str, deadline_s: float = 900) -> int:
    """With the trainer on: wait until every sample so far is trained and the version that
    trained the last of them is served, so that each day starts from all the days before
    whatever the machine's speed; returns that version."""
    conn = await asyncpg.connect(dsn)
    try:
        started = time.monotonic()
        while True:
            waiting = await conn.fetchval(
                "SELECT count(*) FROM samples WHERE trained_in_step IS NULL"
                " AND status IN ('held', 'pending', 'published')"
            )
            last_step = await conn.fetchval("SELECT max(trained_in_step) FROM samples")
            served = await conn.fetchrow(
                "SELECT version, trainer_step FROM weight_versions WHERE status = 'ready'"
                " ORDER BY ready_at DESC LIMIT 1"
            )
            if waiting == 0 and (
                last_step is None
                or (served is not None and (served["trainer_step"] or 0) >= last_step)
            ):
                return int(served["version"]) if served is not None else 0
            if time.monotonic() - started > deadline_s:
                raise SystemExit(f"{waiting} samples still untrained after {deadline_s:.0f} s")
            await asyncio.sleep(1)
    finally:
        await conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=3)
    parser.add_argument("--episodes", type=int, default=4, help="Per user per day.")
    parser.add_argument("--learn", choices=["skills", "weights", "both"], default="skills")
    parser.add_argument("--plot", type=Path, default=Path("skills-days.png"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    console = Console(width=120)
    stack = new_stack("skills-days-")
    stack.env |= {
        # the users' words judge their answers: no judge votes to wait for
        "CLAW_WORKER__REWARDS": '[{"use": "reaction"}]',
        "CLAW_SKILLS__ENABLED": "true",
    }
    no_trainer = ["--no-trainer"] if args.learn == "skills" else []
    gateway, admin = stack.gateway, stack.admin
    results: dict[tuple[str, str], list[list[bool]]] = {
        (t, c): [] for t in TASTES for c in CONDITIONS
    }
    with running(stack, *no_trainer, console=console):
        models = httpx.get(
            f"{gateway}/v1/models", headers={"Authorization": f"Bearer {admin}"}
        ).json()["data"]
        model = policy_model(models)
        t0 = time.monotonic()
        for day in range(args.days):
            liked = asyncio.run(one_day(gateway, admin, model, day, args.episodes, args.seed))
            for key, those in liked.items():
                results[key].append(those)
            today = ", ".join(
                f"{t} {sum(liked[t, 'none'])}/{len(liked[t, 'none'])} -> "
                f"{sum(liked[t, 'skills'])}/{len(liked[t, 'skills'])}"
                for t in TASTES
            )
            console.print(f"day {day + 1} ({time.monotonic() - t0:.0f}s): none -> skills: {today}")
            # the day's lessons kept before the next day: of each user who disliked an answer
            taught = [t for t in TASTES if not all(liked[t, "skills"])]
            asyncio.run(lessons_kept(gateway, admin, taught))
            if args.learn != "skills":
                version = asyncio.run(trained_overnight(stack.dsn))
                console.print(f"  overnight: every sample trained, v{version} served")
        skills = httpx.get(
            f"{gateway}/rl/skills", headers={"Authorization": f"Bearer {admin}"}
        ).json()["skills"]
    # with the trainer on, the users without skills learn through the weights alone
    named = dict(
        zip(
            CONDITIONS,
            ("none", "skills") if args.learn == "skills" else ("weights", "both"),
            strict=True,
        )
    )
    table = Table(title=f"liked share per day ({args.episodes * 2} answers a day, 95% interval)")
    table.add_column("user")
    table.add_column("learns from")
    for day in range(args.days):
        table.add_column(f"day {day + 1}", justify="right")
    shares: dict[tuple[str, str], list[Share]] = {}
    for (taste, condition), days in results.items():
        shares[taste, condition] = [wilson(sum(d), len(d)) for d in days]
        table.add_row(
            taste,
            named[condition],
            *(f"{s.value:.0%} [{s.low:.0%}, {s.high:.0%}]" for s in shares[taste, condition]),
        )
    console.print(table)
    for skill in skills:
        console.print(f"  {skill['scope']}: {skill['text']} (taught {skill['confirmations']}x)")
    console.print(f"plot: {plot(shares, args.days, args.plot, named)}")


def plot(
    shares: dict[tuple[str, str], list[Share]], days: int, path: Path, named: dict[str, str]
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(TASTES), figsize=(3.2 * len(TASTES), 3.4), sharey=True)
    x = list(range(1, days + 1))
    for ax, taste in zip(axes, TASTES, strict=True):
        for k, (condition, colour) in enumerate(
            zip(CONDITIONS, ("tab:grey", "tab:green"), strict=True)
        ):
            s = shares[taste, condition]
            ax.errorbar(
                [d + (k - 0.5) * 0.08 for d in x],  # side by side where they overlap
                [p.value for p in s],
                yerr=[[p.value - p.low for p in s], [p.high - p.value for p in s]],
                marker="o",
                capsize=3,
                color=colour,
                label=named[condition],
            )
        ax.set_title(f"wants {taste}")
        ax.set_xticks(x)
        ax.set_xlabel("day")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("share of answers liked")
    axes[0].legend(fontsize=8)
    trains = "no training" if named["none"] == "none" else "the trainer on"
    fig.suptitle(f"SmolLM2-135M, {trains}: each user's liked share, day by day")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    main()
