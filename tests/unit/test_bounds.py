"""The gateway's request bounds as pure logic: the per-key limiter and vLLM's words."""

from __future__ import annotations

import pytest

from claw_stream.dialect import anthropic_error_of, openai_error_of
from claw_stream.gateway.sessions.bounds import KeyLimiter, prompt_chars, too_long


def test_key_limiter_releases_once() -> None:
    limiter = KeyLimiter(2)
    first, second = limiter.acquire("k"), limiter.acquire("k")
    with pytest.raises(Exception, match="limit 2"):
        limiter.acquire("k")
    first()
    first()  # a second release of the same call frees nothing more
    third = limiter.acquire("k")
    with pytest.raises(Exception, match="limit 2"):
        limiter.acquire("k")
    second(), third()
    assert limiter.inflight == {}
    assert KeyLimiter(None).acquire("k")() is None


def test_too_long_uses_vllms_words_and_each_apis_shape() -> None:
    assert too_long(10, 512, 100, False, "messages") is None
    estimated = too_long(600, 512, None, True, "messages")
    assert estimated is not None and "has at least 600 input tokens" in estimated.message
    refused = too_long(500, 512, 100, False, "messages")
    assert refused is not None
    assert "'max_tokens' or 'max_completion_tokens' is too large: 100" in refused.message
    assert openai_error_of(refused)["error"]["code"] == 400  # the answer's limit: vLLM's 400
    overflow = too_long(600, 512, 100, False, "messages")
    assert overflow is not None
    # OpenAI's code, which Codex and the openai SDK act on
    assert openai_error_of(overflow)["error"] | {"message": ""} == {
        "message": "",
        "type": "BadRequestError",
        "param": "messages",
        "code": "context_length_exceeded",
    }
    # Anthropic's words, which Claude Code acts on
    assert anthropic_error_of(overflow) == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "prompt is too long: 600 tokens > 512 maximum",
        },
    }


def test_prompt_chars_count_contents_tool_calls_and_schemas() -> None:
    body = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "abcd"}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}],
            },
            "not a message",
        ],
        "tools": [{"type": "function"}],
    }
    assert prompt_chars(body) == 4 + 1 + 2 + len('[{"type":"function"}]')


def test_prompt_chars_count_a_legacy_completions_prompt() -> None:
    assert prompt_chars({"prompt": "abcdef"}) == 6
    assert prompt_chars({"prompt": [1, 2, 3]}) == 0  # token ids are counted exactly instead
