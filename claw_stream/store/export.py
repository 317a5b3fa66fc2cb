"""`claw-stream export`: archived samples as SFT, DPO or RL training records, streamed from
Postgres (a server-side cursor, `BATCH` rows at a time) into JSONL or Parquet.

Rows: the samples of the live samples topic that carry a learning signal (status other than
`no_signal`), joined with the steps they were made from, kept by the step's own `created_at`
(the `replay` time filter). DPO reads them ordered by a hash of the prompt, so only the
answers to one prompt are held at a time."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson
from sqlalchemy import func, literal_column, select
from sqlalchemy.sql import Select
from sqlalchemy.sql.elements import ColumnClause

from claw_stream.events import Sample, Step, decode_event
from claw_stream.store import models as m
from claw_stream.store.db import make_engine
from claw_stream.store.export_records import (
    Format,
    Record,
    Row,
    dpo_pairs,
    keep,
    rl_record,
    sft_record,
)
from claw_stream.timerange import TimeRange

BATCH = 500
Progress = Callable[[int, int | None], None]  # (rows read, total rows or None)

# The prompt's messages and tools as Postgres renders jsonb (keys in one canonical order): equal
# prompts hash equal, so ordering by it brings the answers to one prompt together.
PROMPT_HASH: ColumnClause[str] = literal_column(
    "md5(concat((step_payloads.payload->'request'->'messages')::text, '|',"
    " (step_payloads.payload->'request'->'tools')::text))"
)


@dataclass
class ExportReport:
    rows: int = 0  # samples read in the time range
    records: int = 0  # records written


def _query(topic: str, window: TimeRange, fmt: Format, min_reward: float | None) -> Select[Any]:
    q = (
        select(m.SampleRow.payload, m.StepPayload.payload)
        .join(m.StepPayload, m.StepPayload.step_id == m.SampleRow.step_id)
        .where(
            m.SampleRow.payload.is_not(None),
            m.SampleRow.topic == topic,
            m.SampleRow.status != "no_signal",
            # archived after the step was made: a bound on the step's own time, checked below
            m.StepPayload.created_at >= window.since,
        )
    )
    if fmt == "sft" and min_reward is None:
        q = q.where(m.SampleRow.reward > 0)
    elif fmt != "dpo" and min_reward is not None:
        q = q.where(m.SampleRow.reward >= min_reward)
    elif fmt == "dpo":
        q = q.where(m.SampleRow.reward != 0)
    order = [PROMPT_HASH] if fmt == "dpo" else []
    return q.order_by(*order, m.SampleRow.created_at, m.SampleRow.sample_id)


async def archived_rows(
    database_url: str,
    topic: str,
    window: TimeRange,
    fmt: Format,
    min_reward: float | None,
    progress: Progress,
) -> AsyncIterator[tuple[str | None, Row]]:
    """(prompt hash for DPO, row) of each kept sample, streamed."""
    query = _query(topic, window, fmt, min_reward)
    if fmt == "dpo":
        query = query.add_columns(PROMPT_HASH)
    engine = make_engine(database_url)
    try:
        async with engine.connect() as conn:
            total = await conn.scalar(select(func.count()).select_from(query.subquery()))
            progress(0, total)
            result = await conn.stream(query.execution_options(yield_per=BATCH))
            async for batch in result.partitions(BATCH):
                for values in batch:
                    step = decode_event(Step, json.dumps(values[1]))
                    progress(1, None)
                    if step.created_at not in window:
                        continue
                    row = Row(decode_event(Sample, json.dumps(values[0])), step)
                    if keep(row, fmt, min_reward):
                        yield (values[2] if fmt == "dpo" else None), row
    finally:
        await engine.dispose()


async def records(
    rows: AsyncIterator[tuple[str | None, Row]], fmt: Format, report: ExportReport
) -> AsyncIterator[Record]:
    if fmt != "dpo":
        to_record = sft_record if fmt == "sft" else rl_record
        async for _, row in rows:
            report.rows += 1
            yield to_record(row)
        return
    group: list[Row] = []
    current: str | None = None
    async for key, row in rows:
        report.rows += 1
        if key != current and group:
            for pair in dpo_pairs(group):
                yield pair
            group = []
        current = key
        group.append(row)
    for pair in dpo_pairs(group):
        yield pair


# --- writers ---------------------------------------------------------------------------------


class JsonlWriter:
    def __init__(self, out: IO[bytes]):
        self.out = out

    def write(self, batch: list[Record]) -> None:
        self.out.writelines(orjson.dumps(r) + b"\n" for r in batch)

    def close(self) -> None:
        self.out.close()


def parquet_schema(fmt: Format) -> Any:
    import pyarrow as pa

    call = pa.struct(
        [
            ("id", pa.string()),
            ("type", pa.string()),
            ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())])),
        ]
    )
    msg = pa.struct(
        [
            ("role", pa.string()),
            ("content", pa.string()),
            ("name", pa.string()),
            ("tool_calls", pa.list_(call)),
            ("tool_call_id", pa.string()),
            ("reasoning_content", pa.string()),
        ]
    )
    messages = pa.list_(msg)
    fields: dict[Format, list[tuple[str, Any]]] = {
        "sft": [
            ("sample_id", pa.string()),
            ("session_id", pa.string()),
            ("step_id", pa.string()),
            ("reward", pa.float64()),
            ("weight_version", pa.int64()),
            ("messages", messages),
            ("tools", pa.string()),
        ],
        "rl": [
            ("sample_id", pa.string()),
            ("session_id", pa.string()),
            ("group_id", pa.string()),
            ("step_id", pa.string()),
            ("turn_id", pa.string()),
            ("method", pa.string()),
            ("prompt_token_ids", pa.list_(pa.int64())),
            ("response_token_ids", pa.list_(pa.int64())),
            ("response_logprobs", pa.list_(pa.float64())),
            ("teacher_logprobs", pa.list_(pa.float64())),
            ("reward", pa.float64()),
            ("reward_source", pa.string()),
            ("weight_version", pa.int64()),
            ("released_at_version", pa.int64()),
        ],
        "dpo": [
            ("prompt", messages),
            ("chosen", messages),
            ("rejected", messages),
            ("tools", pa.string()),
            ("chosen_reward", pa.float64()),
            ("rejected_reward", pa.float64()),
            ("chosen_sample_id", pa.string()),
            ("rejected_sample_id", pa.string()),
        ],
    }
    return pa.schema(fields[fmt])


class ParquetWriter:
    def __init__(self, out: IO[bytes], fmt: Format):
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.pa = pa
        self.out = out
        self.schema = parquet_schema(fmt)
        self.writer = pq.ParquetWriter(out, self.schema)

    def write(self, batch: list[Record]) -> None:
        self.writer.write_table(self.pa.Table.from_pylist(batch, schema=self.schema))

    def close(self) -> None:
        self.writer.close()  # an empty export still gets the schema
        self.out.close()


def open_writer(path: Path, fmt: Format) -> JsonlWriter | ParquetWriter:
    """Opened before the archive is read, so an unwritable path fails at once (OSError)."""
    if path.suffix == ".parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise RuntimeError(
                "Parquet needs pyarrow: pip install 'claw-stream[export]' (or write .jsonl)"
            ) from None
        return ParquetWriter(path.open("wb"), fmt)
    return JsonlWriter(path.open("wb"))


async def export(
    *,
    database_url: str,
    topic: str,
    fmt: Format,
    window: TimeRange,
    min_reward: float | None,
    out: Path,
    progress: Progress = lambda n, total: None,
) -> ExportReport:
    report = ExportReport()
    writer = open_writer(out, fmt)
    try:
        batch: list[Record] = []
        rows = archived_rows(database_url, topic, window, fmt, min_reward, progress)
        async for record in records(rows, fmt, report):
            batch.append(record)
            if len(batch) >= BATCH:
                writer.write(batch)
                report.records += len(batch)
                batch = []
        if batch:
            writer.write(batch)
            report.records += len(batch)
    finally:
        writer.close()
    return report


def read_records(path: Path) -> Iterator[Record]:
    """An exported file back as records (JSONL or Parquet)."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        yield from pq.read_table(path).to_pylist()
        return
    with path.open("rb") as f:
        for line in f:
            yield orjson.loads(line)
