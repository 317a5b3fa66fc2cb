"""Redaction without a server: the default patterns, custom redactors, bad settings, the cache,
and the Steps built from calls that hold secrets. End to end: tests/e2e/test_redaction.py."""

from __future__ import annotations

import base64
import copy
import json
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from claw_stream.cli import main
from claw_stream.events import Step
from claw_stream.gateway.capture import StepContext, build_step, check_request
from claw_stream.gateway.redaction import DEFAULT_PATTERNS, RedactionError, Redactor
from claw_stream.ids import uuid7
from claw_stream.settings import ConfigError, load_settings

from ..support.paths import AGENTS

HITS = {
    "api_key": [
        "sk-proj-AbCdEf0123456789_ghIJklMNop",
        "sk-ant-api03-abcDEF0123456789abcDEF0123456789-xyz",
        "key=sk-abcdefghijklmnopqrstuvwxyz012345",
    ],
    "github_token": [
        "ghp_" + "a1B2c3D4e5" * 4,
        "github_pat_11ABCDEFG0123456789_abcdefghijklmnop",
    ],
    "aws_access_key_id": ["AKIAIOSFODNN7EXAMPLE", "id=ASIAY34FZKBOKMUTVV7A,"],
    "slack_token": ["xoxb-1234567890-abcdefghij", "xoxp-12345-67890-abcdef"],
    "private_key": [
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA\n-----END RSA PRIVATE KEY-----",
        "-----BEGIN PRIVATE KEY-----\\nMIIE\\n-----END PRIVATE KEY-----",  # inside JSON text
    ],
    "jwt": [
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
    ],
    "bearer_token": ["Authorization: Bearer abcdefghijklmnop0123", "bearer A1b2C3d4E5f6G7h8I9j0=="],
    "email": [
        "jane.doe+work@example.co.uk",
        "mail ops@sub.example.com.",
        "<x_y%z@a-b.io>",
        "noreplyx@corp.com",
        "jo.noreply@corp.com",
    ],
    "phone": [
        "+1 555 123 4567",
        "+44 20 7946 0958",
        "+33 6 12 34 56 78",
        "+4915123456789",
        "+1 (555) 123-4567",
        "(555) 123-4567",
        "555-123-4567",
        "555.123.4567",
        "06 12 34 56 78",
        "020 7946 0958",
        "030 1234567",
        "call 0044 20 7946 0958 now",
    ],
}
MISSES = [
    "sk-learn",
    "task-abcdefghijklmnopqrstuvwxyz",  # sk- inside a word
    "ghp_short",
    "mygithub_pat_11ABCDEFG0123456789_abcdefghijklmnop",
    "AKIAIOSFODNN7EXAMPL",  # one short
    "XAKIAIOSFODNN7EXAMPLE",
    "AKIAIOSFODNN7EXAMPLEX",
    "xoxb-123",
    "-----BEGIN PUBLIC KEY-----\nMIIB\n-----END PUBLIC KEY-----",
    "eyJhbGciOiJIUzI1NiJ9",  # a JWT header alone
    "Bearer token",
    "the bearer of bad news",
    "@mention",
    "user@localhost",
    "lodash@4.17.21",
    # no-reply mailboxes name nobody: Claude Code's every prompt has one
    "Co-Authored-By: Claude Code <noreply@anthropic.com>",
    "no-reply@github.com",
    "donotreply@bank.example",
    "@app.route('/x')",
    "12345",
    "in 2024",
    "2024-01-15 10:30:00",
    "192.168.1.100",
    "+1000",
    "+5 points",
    "1700000000",
    "0123456789",
    "version 1.2.3",
    "call 555-1234",
    "ISBN 978-3-16-148410-0",
    "$1,234,567.89",
    "05 12 2024",
    "1 + 2345678",
    "card 4532 0151 1283 0366",
]
SECRET = "sk-proj-Zx81mQ0pLk3vN7rT2yW5hJ9d"
EMAIL = "jane.doe@example.org"


def redact_tickets(text: str) -> str:
    """A custom redactor, loaded by its import path."""
    return text.replace("TICKET-42", "[ticket]")


def broken_redactor(text: str) -> str:
    raise RuntimeError("cannot")


@pytest.mark.parametrize(("name", "text"), [(n, t) for n, ts in HITS.items() for t in ts])
def test_each_default_pattern_redacts_its_examples(name: str, text: str) -> None:
    found = Redactor(DEFAULT_PATTERNS).text(text)
    assert found.hits == (name,)
    assert f"[REDACTED:{name}]" in found.text


@pytest.mark.parametrize("text", MISSES)
def test_near_misses_are_left_alone(text: str) -> None:
    found = Redactor(DEFAULT_PATTERNS).text(text)
    assert (found.text, found.hits) == (text, ())


@pytest.mark.parametrize(
    "text",
    [
        "A" * 100_000,  # a run with no '@': the email pattern was quadratic on it (20 s)
        base64.b64encode(bytes(range(256)) * 300).decode(),
        "a." * 50_000,
        "x@" + "a-" * 50_000,
        "0 12 " * 20_000,
        "+1 " * 30_000,
    ],
    ids=["one-letter", "base64", "dotted", "dashed-domain", "digit-groups", "plus-digits"],
)
def test_long_texts_of_any_shape_are_scanned_in_linear_time(text: str) -> None:
    started = time.perf_counter()
    Redactor(DEFAULT_PATTERNS, cache_chars=0).text(text)
    assert time.perf_counter() - started < 1.0  # ~10-40 ms each here


def test_a_custom_redactor_runs_after_the_patterns_and_is_counted() -> None:
    counted: list[tuple[str, ...]] = []
    redactor = Redactor(DEFAULT_PATTERNS, [f"{__name__}:redact_tickets"], on_hits=counted.append)
    found = redactor.text(f"TICKET-42 from {EMAIL}")
    assert found.text == "[ticket] from [REDACTED:email]"
    assert found.hits == ("email", f"{__name__}:redact_tickets")
    assert counted == [found.hits]


@pytest.mark.parametrize(
    ("paths", "words"),
    [
        (["nosuch_module_x:f"], "redactor 'nosuch_module_x:f': cannot import nosuch_module_x"),
        ([f"{__name__}:missing"], f"redactor '{__name__}:missing': .* has no function missing"),
        (["just_a_name"], "redactor 'just_a_name': give it as 'module:function'"),
    ],
)
def test_a_redactor_that_cannot_be_loaded_is_named(paths: list[str], words: str) -> None:
    with pytest.raises(RedactionError, match=words):
        Redactor(DEFAULT_PATTERNS, paths)


def test_a_redactor_that_fails_on_a_text_is_named() -> None:
    redactor = Redactor({}, [f"{__name__}:broken_redactor"])
    with pytest.raises(RedactionError, match="broken_redactor' failed: RuntimeError"):
        redactor.text("anything")


@pytest.mark.parametrize(
    ("patterns", "words"),
    [
        ({"ticket": "T-[0-9"}, r"patterns: .*'ticket' \('T-\[0-9'\) is not a valid regular"),
        ({"anything": "x*"}, "'anything' .* matches empty text"),
        ({"bad name!": "x"}, "pattern name 'bad name!'"),
    ],
)
def test_a_bad_pattern_is_a_settings_error_naming_it(patterns: dict[str, str], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        load_settings(gateway={"redaction": {"patterns": patterns}})


def test_patterns_are_merged_over_the_defaults_and_an_empty_one_is_off() -> None:
    settings = load_settings(gateway={"redaction": {"patterns": {"email": "", "ticket": "T-\\d+"}}})
    patterns = settings.gateway.redaction.patterns
    assert patterns["email"] == "" and patterns["ticket"] == "T-\\d+"
    assert patterns["api_key"] == DEFAULT_PATTERNS["api_key"]
    again = type(settings).model_validate_json(settings.model_dump_json())  # --workers N
    assert again.gateway.redaction.patterns == patterns
    found = Redactor(patterns).text(f"T-7 {EMAIL}")
    assert found.text == f"[REDACTED:ticket] {EMAIL}"


def test_the_gateway_command_refuses_a_bad_redactor_or_pattern_readably(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("gateway:\n  redaction:\n    redactors: ['nosuch_module_x:f']\n")
    result = CliRunner().invoke(main, ["gateway", "--config", str(config)])
    assert result.exit_code == 1
    assert "Error: redactor 'nosuch_module_x:f': cannot import nosuch_module_x" in result.output
    config.write_text("gateway:\n  redaction:\n    patterns: {ticket: 'T-[0-9'}\n")
    result = CliRunner().invoke(main, ["gateway", "--config", str(config)])
    assert result.exit_code == 1
    assert "redaction pattern 'ticket' ('T-[0-9') is not a valid regular expression" in (
        result.output
    )


def test_the_cache_gives_what_a_scan_gives_and_stays_bounded() -> None:
    bodies = [
        json.loads(line)["body"]
        for line in (AGENTS / "openclaw" / "session.jsonl").read_text().splitlines()
    ]
    texts = [
        m["content"] for b in bodies for m in b["messages"] if isinstance(m.get("content"), str)
    ]
    texts += [f"{t} reach me at {EMAIL}" for t in texts]
    cached = Redactor(DEFAULT_PATTERNS)
    first = [cached.text(t) for t in texts]
    again = [cached.text(json.loads(json.dumps(t))) for t in texts]  # equal texts, new objects
    scanned = [Redactor(DEFAULT_PATTERNS, cache_chars=0).text(t) for t in texts]
    assert first == again == scanned
    assert cached.misses == len(set(texts))  # the second round came from the cache
    small = Redactor(DEFAULT_PATTERNS, cache_chars=60_000)
    for t in texts:
        small.text(t)
    assert small._chars <= 60_000


def test_openclaws_real_requests_have_nothing_redacted() -> None:
    """A pattern that matched OpenClaw's system prompt would mask, and so stop training on,
    every call of every OpenClaw session."""
    redactor = Redactor(DEFAULT_PATTERNS)
    for name in ("session.jsonl", "variants.jsonl"):
        for line in (AGENTS / "openclaw" / name).read_text().splitlines():
            checked = check_request(json.loads(line)["body"], redactor)
            assert checked.error is None and checked.redacted == ()
    assert redactor.lookups > 100


# --- Steps built from calls that hold secrets -------------------------------------------------

BODY: dict[str, Any] = {
    "model": "policy",
    "messages": [
        {"role": "system", "content": "You are helpful."},
        {
            "role": "user",
            "content": [{"type": "text", "text": f"My key is {SECRET}, mail {EMAIL}"}],
        },
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": f"the user said {EMAIL}",
            "tool_calls": [{"id": "c1", "function": {"name": "send", "arguments": {"to": EMAIL}}}],
        },
        {"role": "tool", "content": f"sent to {EMAIL}", "tool_call_id": "c1"},
    ],
}
CLEAN_BODY: dict[str, Any] = {
    "model": "policy",
    "messages": [{"role": "user", "content": "What is my key?"}],
    "user": EMAIL,  # OpenAI's end-user id, passed through in `extra`: not in the prompt
    "metadata": {"tags": ["x", f"key {SECRET}"], "n": 1},
}


def answer(content: str, arguments: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if arguments is not None:
        message["tool_calls"] = [{"id": "c2", "function": {"name": "f", "arguments": arguments}}]
        message["reasoning_content"] = f"I should use {SECRET}"
    return {
        "model": "policy",
        "prompt_token_ids": [1, 2, 3],
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": {"content": [{"logprob": -0.5}, {"logprob": -0.25}]},
                "finish_reason": "stop",
                "token_ids": [11, 12],
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }


def step_of(
    body: dict[str, Any], reply: dict[str, Any], redactor: Redactor | None
) -> tuple[Step, bytes]:
    ctx = StepContext(uuid7(), "s-1", None, "main", 0, copy.deepcopy(body), redactor=redactor)
    ctx.request = check_request(ctx.body, redactor)  # as the gateway does while the engine works
    _, value = build_step(ctx, reply, 0, 1.0)
    return Step.model_validate_json(value), value


def test_a_secret_in_the_prompt_is_redacted_and_masked_out_of_training() -> None:
    step, value = step_of(BODY, answer("Done."), Redactor(DEFAULT_PATTERNS))
    assert SECRET.encode() not in value and EMAIL.encode() not in value
    user, assistant, tool = step.request.messages[1:]
    assert user.content == "My key is [REDACTED:api_key], mail [REDACTED:email]"
    assert assistant.reasoning_content == "the user said [REDACTED:email]"
    assert json.loads(assistant.tool_calls[0].function.arguments) == {"to": "[REDACTED:email]"}
    assert tool.content == "sent to [REDACTED:email]"
    # its prompt's token ids hold the secret: none are published, and it is not trained
    assert step.train is False and step.prompt_token_ids == []
    assert step.usage.prompt_tokens == 3
    assert step.response_token_ids == [11, 12] and step.response_logprobs == [-0.5, -0.25]


def test_keep_trains_a_step_whose_prompt_had_a_secret_with_its_exact_tokens() -> None:
    redactor = Redactor(DEFAULT_PATTERNS, mask_prompts=False)
    step, value = step_of(BODY, answer("Done."), redactor)
    assert SECRET.encode() not in value
    assert step.train is True and step.prompt_token_ids == [1, 2, 3]


def test_a_secret_only_in_the_answer_is_redacted_from_its_text_not_its_tokens() -> None:
    reply = answer(f"Your key is {SECRET}.", json.dumps({"to": EMAIL}))
    step, value = step_of(CLEAN_BODY, reply, Redactor(DEFAULT_PATTERNS))
    assert SECRET.encode() not in value and EMAIL.encode() not in value
    message = step.response.message
    assert message.content == "Your key is [REDACTED:api_key]."
    assert message.reasoning_content == "I should use [REDACTED:api_key]"
    assert json.loads(message.tool_calls[0].function.arguments) == {"to": "[REDACTED:email]"}
    # the model said it: the tokens stay exact and the step is trained
    assert step.train is True and step.prompt_token_ids == [1, 2, 3]
    assert step.response_token_ids == [11, 12]
    assert step.request.extra == {
        "user": "[REDACTED:email]",
        "metadata": {"tags": ["x", "key [REDACTED:api_key]"], "n": 1},
    }


def test_without_a_redactor_nothing_changes() -> None:
    step, value = step_of(BODY, answer(SECRET), None)
    assert SECRET.encode() in value and step.train is True and step.prompt_token_ids == [1, 2, 3]


def test_a_failing_redactor_keeps_the_request_out_of_the_step() -> None:
    redactor = Redactor({}, [f"{__name__}:broken_redactor"])
    checked = check_request(copy.deepcopy(BODY), redactor)
    assert isinstance(checked.error, RedactionError) and checked.payload == {}
