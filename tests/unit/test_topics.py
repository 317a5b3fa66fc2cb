"""Topic specs, generated schemas, and `apply` against the real Tansu broker."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from claw_stream.bus.schemas import render_schemas, stale_schemas
from claw_stream.bus.topics import load_specs
from claw_stream.cli import main
from claw_stream.events import EVENT_TYPES
from claw_stream.names import DEFAULT_TOPICS
from claw_stream.resources import topics_dir


def test_one_spec_per_topic_of_the_architecture() -> None:
    specs = {s.name: s for s in load_specs()}
    assert set(specs) == {
        "claw.steps",
        "claw.session-events",
        "claw.turns",
        "claw.judgements",
        "claw.samples",
        "claw.weights",
        "claw.dlq",
    }
    assert specs["claw.steps"].value == "Step" and specs["claw.steps"].key == "session_id"
    assert specs["claw.weights"].key == "policy"
    assert specs["claw.steps"].retention_ms == -1  # the replay source is kept
    # Faust joins session-keyed topics partition by partition: their counts must agree
    keyed = {s.partitions for s in specs.values() if s.key == "session_id"}
    assert len(keyed) == 1


def test_committed_json_schemas_are_not_stale() -> None:
    assert stale_schemas() == [], "run `claw-stream topics schemas` and commit topics/schemas/"


def test_stale_schema_is_detected(tmp_path) -> None:
    for name, text in render_schemas().items():
        (tmp_path / name).write_text(text)
    schema = json.loads((tmp_path / "Step.schema.json").read_text())
    del schema["properties"]["response_logprobs"]
    (tmp_path / "Step.schema.json").write_text(json.dumps(schema))
    assert stale_schemas(tmp_path) == ["Step.schema.json"]


def test_schemas_describe_the_models() -> None:
    schema = json.loads((topics_dir() / "schemas" / "Step.schema.json").read_text())
    assert {"step_id", "session_id", "response_token_ids", "response_logprobs"} <= set(
        schema["required"]
    )
    assert schema["additionalProperties"] is False
    assert len(render_schemas()) == len(EVENT_TYPES)


def test_cli_apply_against_no_broker_is_a_readable_error() -> None:
    result = CliRunner().invoke(main, ["topics", "apply", "--kafka-bootstrap", "127.0.0.1:9"])
    assert result.exit_code == 1
    assert "Error: KafkaConnectionError" in result.output
    assert "Traceback" not in result.output


def test_bad_spec_file_is_named(tmp_path) -> None:
    (tmp_path / "claw.x.yaml").write_text("name: claw.x\npartitions: zero\n")
    with pytest.raises(ValueError, match=r"claw\.x\.yaml"):
        load_specs(tmp_path)


def test_the_default_topic_names_are_the_spec_files_names() -> None:
    """names.py names the topics, topics/*.yaml specifies them: the two must agree."""
    assert set(DEFAULT_TOPICS.by_role().values()) == {s.name for s in load_specs()}
