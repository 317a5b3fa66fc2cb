"""What the worker binds into JSONB columns: a NUL character, which Postgres refuses in JSONB
(and with it the whole insert), becomes U+FFFD; everything else is the event's own JSON."""

from __future__ import annotations

import json

from claw_stream.worker.state.rows import as_json

from ..support.factories import answered, make_step


def test_a_nul_in_an_answer_becomes_a_replacement_character_and_nothing_else_changes() -> None:
    step = answered(make_step(), 'a\x00b, a backslash then u0000: \\u0000, and "\\\x00"')
    text = as_json(step)
    assert "\\u0000" not in text.replace("\\\\u0000", "")
    content = json.loads(text)["response"]["message"]["content"]
    assert content == 'a\ufffdb, a backslash then u0000: \\u0000, and "\\\ufffd"'
    plain = answered(make_step(), "nothing to change")
    assert as_json(plain) == plain.model_dump_json()
