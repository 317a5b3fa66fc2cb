"""`claw-stream export` on a small archive written through the worker's own store code
(`worker/state/`: archive_step, store_samples) in a database of its own."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from claw_stream.cli import main
from claw_stream.events import Step
from claw_stream.store import export as export_module
from claw_stream.store.db import make_engine
from claw_stream.store.export import read_records
from claw_stream.store.export_records import Row, rl_record, sft_record
from claw_stream.worker.logic.release import Gate, Gates, decide
from claw_stream.worker.logic.samples import Draft
from claw_stream.worker.state.archive import archive_step
from claw_stream.worker.state.outbox import store_samples

from ..support.factories import answered, make_step, sample_of
from ..support.postgres import new_database


class Archive:
    def __init__(self, url: str):
        self.url = url
        self.rows: dict[str, Row] = {}  # by label

    async def add(
        self, label: str, step: Step, reward: float, *, signal: bool = True, topic: str = ""
    ) -> Row:
        sample = sample_of(step, reward)
        engine = make_engine(self.url)
        try:
            async with engine.begin() as conn:
                await archive_step(conn, step)
                gates = Gates("policy", {"policy": Gate(0, False)})
                decided = decide([Draft(sample, signal)], gates, 99)
                await store_samples(conn, decided, topic or "claw.samples")
        finally:
            await engine.dispose()
        self.rows[label] = Row(sample, step)
        return self.rows[label]


async def fill(archive: Archive) -> None:
    base = make_step()  # a tool-calling answer to a request with tools
    await archive.add("tool call", base, 1.0)
    await archive.add("right", answered(base, "right", "What is 2+2?"), 1.0)
    await archive.add("wrong", answered(base, "wrong", "What is 2+2?"), -1.0)
    await archive.add("half", answered(base, "half right", "Name a prime."), 0.5)
    await archive.add("bad", answered(base, "bad", "Name a colour."), -1.0)
    await archive.add("no signal", answered(base, "meh", "Name a colour."), 0.0, signal=False)
    await archive.add("replayed", answered(base, "other", "What is 2+2?"), -1.0, topic="claw.x")
    old = answered(base, "old wrong", "Name a prime.")
    old = old.model_copy(update={"created_at": datetime.now(UTC) - timedelta(days=3)})
    await archive.add("old", old, -1.0)


@pytest.fixture(scope="module")
def archive(postgres: Any) -> Archive:
    archive = Archive(new_database(postgres, "export"))
    asyncio.run(fill(archive))
    return archive


def export(archive: Archive, out: Path, *args: str) -> Any:
    return CliRunner().invoke(
        main, ["export", "--database-url", archive.url, "--out", str(out), *args]
    )


def sample_ids(records: list[dict[str, Any]]) -> set[str]:
    return {r["sample_id"] for r in records}


def ids(archive: Archive, *labels: str) -> set[str]:
    return {str(archive.rows[label].sample.sample_id) for label in labels}


def test_sft_is_the_rewarded_turns_as_chat_messages(archive: Archive, tmp_path: Path) -> None:
    out = tmp_path / "sft.jsonl"
    result = export(archive, out, "--format", "sft", "--since", "1d")
    assert result.exit_code == 0, result.output
    records = list(read_records(out))
    assert sample_ids(records) == ids(archive, "tool call", "right", "half")
    by_id = {r["sample_id"]: r for r in records}
    for label in ("tool call", "right", "half"):
        row = archive.rows[label]
        assert by_id[str(row.sample.sample_id)] == sft_record(row)
    assert by_id[str(archive.rows["right"].sample.sample_id)]["messages"][-1]["content"] == "right"
    assert "3 sft records from 3 samples" in result.output

    out = tmp_path / "sft-min.jsonl"
    result = export(archive, out, "--format", "sft", "--since", "1d", "--min-reward", "1")
    assert result.exit_code == 0, result.output
    assert sample_ids(list(read_records(out))) == ids(archive, "tool call", "right")


def test_rl_holds_every_sample_with_a_signal(archive: Archive, tmp_path: Path) -> None:
    out = tmp_path / "rl.jsonl"
    result = export(archive, out, "--format", "rl", "--since", "1d")
    assert result.exit_code == 0, result.output
    records = list(read_records(out))
    labels = ("tool call", "right", "wrong", "half", "bad")
    assert sorted(records, key=lambda r: r["sample_id"]) == sorted(
        (rl_record(archive.rows[label]) for label in labels), key=lambda r: r["sample_id"]
    )
    # the time filter is replay's: --since 4d takes the old step in, --until leaves all out
    result = export(archive, out, "--format", "rl", "--since", "4d", "--min-reward", "-1")
    assert sample_ids(list(read_records(out))) == ids(archive, *labels, "old")
    result = export(archive, out, "--format", "rl", "--since", "4d", "--until", "2d")
    assert sample_ids(list(read_records(out))) == ids(archive, "old")


def test_dpo_pairs_opposite_rewards_on_one_prompt(archive: Archive, tmp_path: Path) -> None:
    out = tmp_path / "dpo.jsonl"
    result = export(archive, out, "--format", "dpo", "--since", "4d")
    assert result.exit_code == 0, result.output
    pairs = {
        (p["prompt"][-1]["content"], p["chosen"][0]["content"], p["rejected"][0]["content"])
        for p in read_records(out)
    }
    # "bad" has no rewarded answer to its prompt; the replayed sample is another topic's
    assert pairs == {
        ("What is 2+2?", "right", "wrong"),
        ("Name a prime.", "half right", "old wrong"),
    }
    result = export(archive, out, "--format", "dpo", "--since", "1d")
    assert {p["chosen"][0]["content"] for p in read_records(out)} == {"right"}


@pytest.mark.parametrize("fmt", ["sft", "dpo", "rl"])
def test_parquet_and_jsonl_hold_the_same_rows(
    archive: Archive, tmp_path: Path, fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(export_module, "BATCH", 2)  # several fetches and written batches
    jsonl, parquet = tmp_path / f"{fmt}.jsonl", tmp_path / f"{fmt}.parquet"
    for out in (jsonl, parquet):
        result = export(archive, out, "--format", fmt, "--since", "4d")
        assert result.exit_code == 0, result.output
    from_jsonl, from_parquet = list(read_records(jsonl)), list(read_records(parquet))
    assert from_jsonl and from_parquet == from_jsonl
    assert parquet.read_bytes()[:4] == b"PAR1"


def test_bad_input_gets_a_clear_error(archive: Archive, tmp_path: Path) -> None:
    out = tmp_path / "x.jsonl"
    result = export(archive, out, "--format", "csv", "--since", "1d")
    assert result.exit_code == 2 and "'csv' is not one of 'sft', 'dpo', 'rl'" in result.output
    result = export(archive, out, "--format", "sft", "--since", "yesterday")
    assert result.exit_code == 2 and "neither an ISO time" in result.output
    result = export(archive, out, "--format", "sft", "--since", "1h", "--until", "2h")
    assert result.exit_code == 2 and "--until must be after --since" in result.output
    result = export(archive, out, "--format", "dpo", "--since", "1d", "--min-reward", "1")
    assert result.exit_code == 2 and "--min-reward does not apply to dpo" in result.output
    result = export(
        archive, tmp_path / "no" / "such" / "dir.jsonl", "--format", "sft", "--since", "1d"
    )
    assert result.exit_code == 1 and "cannot write --out" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("name", ["empty.jsonl", "empty.parquet"])
def test_an_empty_result_writes_an_empty_file(archive: Archive, tmp_path: Path, name: str) -> None:
    out = tmp_path / name
    result = export(archive, out, "--format", "sft", "--since", "2099-01-01")
    assert result.exit_code == 0, result.output
    assert "nothing to export" in result.output
    assert out.exists() and list(read_records(out)) == []
