"""Does the loop learn? The whole embedded stack, the demo persona, headless.

Starts `claw-stream up` on a fresh data dir (SmolLM2-135M on CPU: engine, gateway, worker,
trainer), plays `--episodes` episodes of the persona who wants answers under 30 words (thumbs
up for a short answer, down for a long one, per answer), and prints the share of short answers
and the mean reward for the first and the last policy version, with the time it took; and
every version served on the same 24 held-out questions (never trained, the same seed each
version), with the last version's win rate against v0 and its 95% interval.
With `--continuous` the same number of answers comes from `--concurrency` conversations that
never end (one session key each, thumbs on every answer, a pause longer than the worker's idle
timeout every 6 answers): the personal-agent case, trained per turn across the pauses.
With `--tasks arithmetic` it trains on dataset tasks instead (`claw-stream tasks run`, GRPO
groups of `--group-size`), while the evaluator scores every ready version on the held-out set
(`eval.on_ready`), and prints the eval score of the first and the last version, with a plot.
With `--tenants 2` two users of opposite tastes share the stack, each with an adapter of its
own (tenants alice and bob, `tenants.adapters`), asking for answers in one or two sentences:
alice wants them under 30 words, bob 30 words or more; each plays `--episodes` episodes, each tenant's adapter answers the held-out
questions as it trains, and the shared policy answers them before and after (no sample of
theirs may train it). Prints each adapter's held-out answers' mean length and pass share (by
its tenant's rule), first and last,
whether the shared policy moved, with a plot of both curves; then the replay and the report
per tenant.
Both end with `claw-stream report` on the stack: the held-out win rates per version, and how
long a user's feedback waited until a version trained on it answered (p50, p95).
With `--learn skills` the stack runs without a trainer and the persona's corrections become
its skills (`claw_stream/skills/`): the held-out set is asked at the start without them and at
the end with them; `--learn both` trains as well.
Run: python bench/learning_bench.py [--episodes 96] [--lr 5e-5] [--plot learning.png] [--continuous]
     python bench/learning_bench.py --learn skills --episodes 10
     python bench/learning_bench.py --tasks arithmetic [--group-size 4] [--rounds 2] [--limit 24]
     python bench/learning_bench.py --tenants 2 [--episodes 48] [--adapter-lr 5e-4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.stack import new_stack, running  # noqa: E402
from claw_stream.demo.held_out import HELD_OUT_QUESTIONS, answered_now  # noqa: E402
from claw_stream.demo.persona import ASK_BRIEFLY, Persona  # noqa: E402
from claw_stream.demo.report import plot, plot_tenants, tables  # noqa: E402
from claw_stream.demo.run import run_demo  # noqa: E402
from claw_stream.demo.tally import HeldOutAnswer, Tally, mean_words  # noqa: E402
from claw_stream.evaluation.held_out_records import save_item_scores  # noqa: E402
from tests.support.processes import free_port  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=96)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--plot", type=Path, default=Path("learning.png"))
    parser.add_argument(
        "--continuous",
        action="store_true",
        help="One never-ending session per concurrent user, with idle pauses.",
    )
    parser.add_argument("--pause", type=float, default=60.0, help="Idle pause (continuous), s.")
    parser.add_argument(
        "--held-out-every",
        type=int,
        default=1,
        help="Score every Nth version on the held-out questions (the first and last always).",
    )
    parser.add_argument(
        "--prm-votes",
        type=int,
        default=0,
        help="The judge's votes per turn (the embedded default is 3); 0: the persona's thumbs "
        "alone are the reward, no judge load.",
    )
    parser.add_argument(
        "--holdout-share",
        type=float,
        default=0.25,
        help="eval.holdout_share: the persona's turns held out of training, asked again of the "
        "last version at the end (scored by the persona's rule and by the judge).",
    )
    parser.add_argument(
        "--tenants",
        type=int,
        choices=(0, 2),
        default=0,
        help="2: two tenants of opposite tastes, each its own adapter (alice short, bob long).",
    )
    parser.add_argument(
        "--adapter-lr", type=float, default=5e-4, help="--tenants: tenants.lr, the adapters' rate."
    )
    parser.add_argument("--tasks", default=None, help="Train on this task dataset instead.")
    parser.add_argument("--group-size", type=int, default=4, help="--tasks: G attempts per task.")
    parser.add_argument("--rounds", type=int, default=2, help="--tasks: passes over the tasks.")
    parser.add_argument("--limit", type=int, default=24, help="--tasks: tasks per pass.")
    parser.add_argument("--eval-limit", type=int, default=12, help="--tasks: held-out tasks.")
    parser.add_argument(
        "--signal-groups",
        type=int,
        default=None,
        help="--tasks: per pass, draw tasks until this many groups have signal (default: "
        "--limit; 0: every task once, no dynamic sampling).",
    )
    parser.add_argument(
        "--learn",
        choices=["weights", "skills", "both"],
        default="weights",
        help="What the persona teaches: the weights, its skills (the stack runs without a "
        "trainer), or both; with skills the held-out set is asked again with them at the end.",
    )
    args = parser.parse_args()
    # a `timeout` stops the bench with SIGTERM: the stack stops too (`running` ends)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    console = Console(width=120)
    stack = new_stack("learning-bench-")
    data, ports, admin = stack.data, stack.ports, stack.admin
    env = stack.env
    env |= {
        "CLAW_TRAINER__LR": str(args.lr),
        "CLAW_TRAINER__BATCH_SIZE": str(args.batch_size),
        "CLAW_WORKER__PRM_VOTES": str(args.prm_votes),
        # the replay's judge, in this process: the embedded engine, as the worker's
        "CLAW_WORKER__JUDGE_URL": f"http://127.0.0.1:{ports['engine']}/v1",
        "CLAW_EVAL__HOLDOUT_SHARE": str(0.0 if args.tasks else args.holdout_share),
        "CLAW_SKILLS__ENABLED": "true" if args.learn != "weights" else "false",
    }
    if args.tasks:
        env |= {
            "CLAW_TRAINER__GROUP_SIZE": str(args.group_size),
            "CLAW_EVAL__ON_READY": "true",
            "CLAW_EVAL__DATASET": f"{args.tasks}-heldout",
            "CLAW_EVAL__LIMIT": str(args.eval_limit),
            "CLAW_EVAL__MAX_TOKENS": "32",
            "CLAW_EVAL__METRICS_PORT": str(free_port()),
        }
    if args.tenants:
        env |= {
            "CLAW_TENANTS__ADAPTERS": json.dumps(list(TASTES)),
            "CLAW_TENANTS__LR": str(args.adapter_lr),
        }
    if args.continuous:  # the pauses outlast the idle timeout: each one closes a segment
        # and the idle timeout outlasts a call (SmolLM2 on 2 loaded cores, beside the trainer:
        # with 4 s every call made a segment of its own, measured)
        env["CLAW_WORKER__IDLE_TIMEOUT_S"] = str(max(20.0, args.pause / 2))
    no_trainer = ["--no-trainer"] if args.learn == "skills" else []
    with running(stack, *no_trainer, console=console):
        if args.tasks:
            tasks_run(args, console, f"http://127.0.0.1:{ports['gateway']}", admin, ports["pg"])
            learning_report(env, data)
            return
        if args.tenants:
            tenants_run(args, console, f"http://127.0.0.1:{ports['gateway']}", admin, env, data)
            return
        persona = Persona(30)
        done = 0
        t0 = time.monotonic()

        def progress(answers: list) -> None:
            nonlocal done
            done += 1 if not args.continuous else len(answers) / 2
            if done % 8 == 0:
                v = max(a.version for a in answers)
                console.print(
                    f"  {done}/{args.episodes} episodes, {time.monotonic() - t0:.0f}s, policy v{v}"
                )

        tally = asyncio.run(
            run_demo(
                f"http://127.0.0.1:{ports['gateway']}",
                admin,
                args.episodes,
                concurrency=args.concurrency,
                persona=persona,
                on_answers=progress,
                continuous=args.continuous,
                pause_s=args.pause if args.continuous else 0.0,
                held_out=HELD_OUT_QUESTIONS,
                held_out_every=args.held_out_every,
                learn=args.learn,
            )
        )
        minutes = (time.monotonic() - t0) / 60
        rows = tally.per_version()
        for table in tables(tally, 30):
            console.print(table)
        first = rows[0]
        last = [r for r in rows if r[1] >= 8][-1] if any(r[1] >= 8 for r in rows) else rows[-1]
        quarter = tally.answers[-max(1, len(tally.answers) // 4) :]
        console.print(
            f"live answers: first version v{first[0]}: {first[2]:.0%} short, reward "
            f"{first[3]:+.2f} ({first[1]} answers); last version v{last[0]}: {last[2]:.0%} "
            f"short, reward {last[3]:+.2f} ({last[1]} answers); last quarter of answers: "
            f"{sum(a.short for a in quarter) / len(quarter):.0%} short. "
            f"{args.episodes} episodes' worth of answers"
            f"{' in never-ending sessions' if args.continuous else ''} in {minutes:.1f} min."
        )
        console.print(f"held-out: {tally.verdict()}")
        if args.learn != "weights":
            console.print(
                f"held-out with skills ({minutes:.1f} min from the first episode to the last "
                f"held-out answer): {tally.skills_verdict()}"
            )
        console.print(f"plot: {plot(tally, args.plot, 30)}")
        asyncio.run(save_item_scores(env["CLAW_DATABASE_URL"], "policy", tally.item_scores()))
        replay_held_out(env, f"http://127.0.0.1:{ports['gateway']}", persona, console)
        learning_report(env, data)


# the tenants of `--tenants 2`, of opposite tastes on the same questions, asked for an answer
# in one or two sentences (SmolLM2's v0 gave 14 of 24 held-out answers under 30 words): alice
# wants them under 30 words, bob 30 words or more
HeldOutSet = tuple[int, list[HeldOutAnswer]]  # the version that answered, its answers
TASTES = {
    "alice": Persona(30, "short", ASK_BRIEFLY),
    "bob": Persona(30, "long", ASK_BRIEFLY),
}


def tenants_run(
    args: argparse.Namespace,
    console: Console,
    gateway: str,
    admin: str,
    env: dict[str, str],
    data: Path,
) -> None:
    """Both tenants' demos at once, each held-out set answered by the tenant's own adapter;
    the shared policy's held-out set before and after; then per tenant the replay and the
    report."""
    t0 = time.monotonic()
    done = dict.fromkeys(TASTES, 0)

    def progress(name: str):  # type: ignore[no-untyped-def]
        def seen(answers: list) -> None:
            done[name] += 1
            if done[name] % 8 == 0:
                console.print(
                    f"  {name}: {done[name]}/{args.episodes} episodes, "
                    f"{time.monotonic() - t0:.0f}s, {name}@v{max(a.version for a in answers)}"
                )

        return seen

    async def everything() -> tuple[dict[str, Tally], HeldOutSet, HeldOutSet]:
        before = await answered_now(gateway, admin, TASTES["alice"])  # the shared policy's
        tallies = await asyncio.gather(
            *(
                run_demo(
                    gateway,
                    admin,
                    args.episodes,
                    concurrency=args.concurrency,
                    persona=persona,
                    on_answers=progress(name),
                    held_out=HELD_OUT_QUESTIONS,
                    held_out_every=args.held_out_every,
                    tenant=name,
                )
                for name, persona in TASTES.items()
            )
        )
        after = await answered_now(gateway, admin, TASTES["alice"])
        return dict(zip(TASTES, tallies, strict=True)), before, after

    tallies, before, after = asyncio.run(everything())
    minutes = (time.monotonic() - t0) / 60
    for name, tally in tallies.items():
        persona = TASTES[name]
        rule = f"{'under' if persona.wants == 'short' else 'at least'} {persona.max_words} words"
        for table in tables(tally, persona.max_words, persona.wants, title=f"{name}: "):
            console.print(table)
        first, last = min(tally.held_out), max(tally.held_out)
        console.print(
            f"{name} (wants answers {rule}): held-out mean words v{first} "
            f"{mean_words(tally.held_out[first]):.0f} -> {name}@v{last} "
            f"{mean_words(tally.held_out[last]):.0f}; " + tally.verdict(f"answers {rule}")
        )
        asyncio.run(save_item_scores(env["CLAW_DATABASE_URL"], name, tally.item_scores()))
    (v_before, set_before), (v_after, set_after) = before, after
    same = sum(a.words == b.words for a, b in zip(set_before, set_after, strict=True))
    console.print(
        f"shared policy: v{v_before} before, v{v_after} after; held-out mean words "
        f"{mean_words(set_before):.0f} -> {mean_words(set_after):.0f}; {same} of {len(set_after)} "
        f"answers of the same length. {args.episodes} episodes per tenant in {minutes:.1f} min."
    )
    console.print(f"plot: {plot_tenants(tallies, set_before, args.plot)}")
    for name, persona in TASTES.items():
        replay_held_out(env, gateway, persona, console, tenant=name)
        learning_report(env, data, tenant=name)


def replay_held_out(
    env: dict[str, str],
    gateway: str,
    persona: Persona,
    console: Console,
    tenant: str | None = None,
) -> None:
    """The persona's held-out turns asked again of the last version (the tenant's adapter):
    the persona's rule decides each pair, the judge votes beside it, and the report measures
    how often they agree."""
    from claw_stream.cli.evaluate import print_replay
    from claw_stream.evaluation.replay.service import NamedRule, replay
    from claw_stream.settings import load_settings

    os.environ.update(env)
    settings = load_settings()
    settings.eval.replay_limit = 200  # every held-out turn, for the agreement's interval
    rule = NamedRule("persona", lambda request, answer: float(persona.likes(answer)))
    t0 = time.monotonic()
    done = asyncio.run(replay(settings, settings.eval, gateway, rule=rule, tenant=tenant))
    print_replay(done, settings.eval.holdout_share)
    console.print(
        f"replay of {done.held_out} held-out turns{f' of {tenant}' if tenant else ''}: "
        f"{time.monotonic() - t0:.0f}s"
    )


def learning_report(env: dict[str, str], data: Path, tenant: str | None = None) -> None:
    """`claw-stream report` on the stack: per version, the held-out win rates, and how long
    feedback waited until a version trained on it served (p50, p95); a tenant's own."""
    out = data / "report" / (tenant or "")
    more = ["--tenant", tenant] if tenant else []
    subprocess.run(
        [sys.executable, "-m", "claw_stream", "report", "--out", str(out), *more],
        env=env,
        check=True,
    )


def tasks_run(
    args: argparse.Namespace, console: Console, gateway: str, admin: str, pg: int
) -> None:
    """GRPO rounds over the task set; the evaluator scores each ready version meanwhile."""
    import asyncpg

    from claw_stream.evaluation.plot import plot_scores
    from claw_stream.tasks.dataset import load_tasks
    from claw_stream.tasks.runner import RunOptions, run_tasks

    async def scores() -> list[tuple[int, float, int]]:
        conn = await asyncpg.connect(f"postgresql://claw@127.0.0.1:{pg}/claw")
        try:
            rows = await conn.fetch("SELECT version, score, n_episodes FROM eval_scores")
        finally:
            await conn.close()
        return sorted((r["version"], r["score"], r["n_episodes"]) for r in rows)

    async def set_aside() -> int:
        """Groups the trainer did not train: their rewards were all equal."""
        conn = await asyncpg.connect(f"postgresql://claw@127.0.0.1:{pg}/claw")
        try:
            return int(
                await conn.fetchval(
                    "SELECT count(DISTINCT group_id) FROM samples WHERE status = 'zero_advantage'"
                )
            )
        finally:
            await conn.close()

    tasks = load_tasks(args.tasks, args.limit)
    signal_groups = len(tasks) if args.signal_groups is None else args.signal_groups
    t0 = time.monotonic()
    flat = drawn = 0
    for round_ in range(args.rounds):
        opts = RunOptions(
            group_size=args.group_size,
            max_tokens=32,
            concurrency=args.concurrency,
            seed=round_,
            signal_groups=signal_groups or None,
        )
        report = asyncio.run(run_tasks(gateway, admin, tasks, opts))
        flat += len(report.flat_groups)
        drawn += len(report.groups())
        console.print(
            f"round {round_ + 1}: {len(report.groups())} groups drawn, "
            f"{len(report.flat_groups)} with equal rewards (no signal), "
            f"{len(report.episodes)} episodes, pass rate "
            f"{report.pass_rate:.0%}, versions {[v for v, *_ in report.per_version()]}, "
            f"{time.monotonic() - t0:.0f}s"
        )
    # the last versions train and are evaluated: until the newest has a whole run (a version
    # that came mid-run is scored on part of the set; the evaluator runs again for the newest)
    deadline = time.monotonic() + 240
    seen = asyncio.run(scores())
    while time.monotonic() < deadline:
        time.sleep(10)
        now = asyncio.run(scores())
        settled = now and seen and now[-1][0] == seen[-1][0] and len(now) > 1
        if settled and now[-1][2] >= args.eval_limit:
            break
        seen = now
    rows = asyncio.run(scores())
    table = Table("version", "eval score", "episodes", title=f"eval on {args.tasks}-heldout")
    for version, score, n in rows:
        table.add_row(str(version), f"{score:.0%}", str(n))
    console.print(table)
    if rows:
        console.print(
            f"first v{rows[0][0]}: {rows[0][1]:.0%}; last v{rows[-1][0]}: {rows[-1][1]:.0%}; "
            f"{(time.monotonic() - t0) / 60:.1f} min"
        )
        console.print(f"plot: {plot_scores([(v, s) for v, s, _ in rows], args.plot)}")
    console.print(
        f"groups drawn: {drawn}, with equal rewards: {flat} "
        f"(the trainer set aside {asyncio.run(set_aside())} without training them)"
    )


if __name__ == "__main__":
    main()
