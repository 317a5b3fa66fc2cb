"""How well each judge reads the user's next words: the `reaction` source (a lexicon) and the
PRM on the built-in engine (SmolLM2-135M by default), against labelled next states.

Each labelled row of bench/data/reactions*.jsonl (approvals, corrections, neutral follow-ups,
tool results) closes the same short turn (a question and the agent's answer); the PRM judges
it with the worker's own prompt and votes (JudgeClient, `worker.prm_votes`), the reaction
source reads the words. A judge agrees with a row when its sign matches the label (0: it
abstained or voted 0); "wrong sign" counts approvals read as corrections and the reverse.

Run: python bench/judge_agreement_bench.py [--model smollm2-135m] [--votes 3] [--no-stop]
(`--no-prm` measures the lexicon alone, in a second; `--no-stop`: votes run on past their box
to --max-tokens, as before `worker.judge_stop_at_verdict`.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from claw_stream.embedded.models import ensure_model  # noqa: E402
from claw_stream.events import ChatMessage, Turn  # noqa: E402
from claw_stream.settings import load_settings  # noqa: E402
from claw_stream.worker.config import WorkerSettings  # noqa: E402
from claw_stream.worker.judge_client import JudgeClient  # noqa: E402
from claw_stream.worker.reaction import reaction, user_words  # noqa: E402
from tests.support.engine import EngineProcess  # noqa: E402
from tests.support.factories import make_turn  # noqa: E402

DATA = REPO / "bench" / "data"
SETS = ("reactions", "reactions-heldout")
console = Console()


def rows(limit: int | None = None) -> list[tuple[str, list[ChatMessage], int, str]]:
    """Each set's rows; with `limit`, that many of each set, spread over its kinds."""
    out = []
    for name in SETS:
        lines = (DATA / f"{name}.jsonl").read_text().splitlines()
        if limit is not None:
            lines = lines[:: max(1, len(lines) // limit)][:limit]
        for line in lines:
            r = json.loads(line)
            out.append((name, [ChatMessage(**m) for m in r["next"]], r["label"], r["kind"]))
    return out


def turn_of(next_state: list[ChatMessage]) -> Turn:
    base = make_turn()
    step = base.step.model_copy(
        update={
            "request": base.step.request.model_copy(
                update={"messages": [ChatMessage(role="user", content="What is 7 times 8?")]}
            ),
            "response": base.step.response.model_copy(
                update={"message": ChatMessage(role="assistant", content="7 times 8 is 56.")}
            ),
        }
    )
    return base.model_copy(update={"step": step, "next_state": next_state})


def sign(value: float | None) -> int:
    return 0 if not value else (1 if value > 0 else -1)


async def prm_signs(
    url: str,
    data: list[tuple[str, list[ChatMessage], int, str]],
    votes: int,
    max_tokens: int,
    stop: bool,
) -> list[int]:
    config = WorkerSettings(
        judge_url=url,
        prm_votes=votes,
        judge_timeout_s=600,
        judge_max_tokens=max_tokens,
        judge_stop_at_verdict=stop,
    )
    judge = JudgeClient(config, sources=[])
    out: list[int] = []
    try:
        with Progress(console=console) as progress:
            task = progress.add_task("PRM votes", total=len(data))
            for _, next_state, _, _ in data:
                outcome = await judge.judge(turn_of(next_state))
                out.append(sign(outcome.judgement.prm_score))
                progress.advance(task)
    finally:
        await judge.aclose()
    return out


def table(title: str, data, judged: dict[str, list[int]]) -> Table:
    t = Table(
        "set",
        "kind",
        "rows",
        *[f"{j} agrees" for j in judged],
        *[f"{j} wrong sign" for j in judged],
        title=title,
    )
    groups: dict[tuple[str, str], list[int]] = {}
    for i, (name, _, _, kind) in enumerate(data):
        groups.setdefault((name, kind), []).append(i)
    for (name, kind), idx in groups.items():
        labels = [data[i][2] for i in idx]
        agree = [sum(judged[j][i] == data[i][2] for i in idx) for j in judged]
        wrong = [sum(judged[j][i] * data[i][2] < 0 for i in idx) for j in judged]
        t.add_row(name, kind, str(len(labels)), *map(str, agree), *map(str, wrong))
    for name in SETS:
        idx = [i for i, r in enumerate(data) if r[0] == name]
        agree = [sum(judged[j][i] == data[i][2] for i in idx) for j in judged]
        wrong = [sum(judged[j][i] * data[i][2] < 0 for i in idx) for j in judged]
        t.add_row(
            f"[b]{name}[/]",
            "all",
            str(len(idx)),
            *[f"{a} ({a / len(idx):.0%})" for a in agree],
            *map(str, wrong),
        )
    return t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--votes", type=int, default=3)
    parser.add_argument("--no-prm", action="store_true")
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=256,
        help="per PRM vote (worker.judge_max_tokens, 4,096 by default for thinking judges: "
        "SmolLM2 rambles to it, minutes a turn on 2 cores)",
    )
    parser.add_argument("--limit", type=int, default=None, help="rows of each set")
    parser.add_argument(
        "--no-stop", action="store_true", help="votes run on past their box to --max-tokens"
    )
    args = parser.parse_args()
    data = rows(args.limit)
    started = time.perf_counter()
    judged = {
        "reaction": [sign(getattr(reaction(user_words(n)), "score", None)) for _, n, _, _ in data]
    }
    lexicon_s = time.perf_counter() - started
    if not args.no_prm:
        settings = load_settings()
        model = ensure_model(args.model, settings.models_dir)
        with tempfile.TemporaryDirectory() as tmp:
            engine = EngineProcess(model, Path(tmp))  # its log is shown if it never comes up
            try:
                started = time.perf_counter()
                judged["prm"] = asyncio.run(
                    prm_signs(
                        f"{engine.base_url}/v1", data, args.votes, args.max_tokens, not args.no_stop
                    )
                )
                prm_s = time.perf_counter() - started
            finally:
                engine.stop()
        console.print(
            f"PRM ({args.model}, {args.votes} votes of at most {args.max_tokens} tokens, "
            f"{'run on past their box' if args.no_stop else 'stopped at their box'}): "
            f"{prm_s:.0f} s, {prm_s / len(data):.1f} s a turn"
        )
    console.print(
        f"reaction: {lexicon_s * 1000 / len(data):.2f} ms a turn (first call loads the lexicon)"
    )
    console.print(table("agreement with the labels (0 = abstained or voted 0)", data, judged))


if __name__ == "__main__":
    main()
