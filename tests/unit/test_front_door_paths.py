"""Which API and session each path a client may use names (`gateway.paths.route`)."""

from __future__ import annotations

import pytest

from claw_stream.gateway.paths import Route, route


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/chat/completions", Route("chat", None, None)),
        ("/v1/chat/completions", Route("chat", None, None)),
        ("/v1/v1/messages", Route("messages", None, None)),  # a /v1 base URL + Anthropic's /v1
        ("/completions", Route("completions", None, None)),
        ("/v1/responses", Route("responses", None, None)),
        ("/models", Route("models", None, None)),
        ("/v1/messages/count_tokens", Route("count_tokens", None, None)),
        ("/s/g/v1/messages/count_tokens", Route("count_tokens", "s", "g")),
        ("/traj-1/prompt-2/chat/completions", Route("chat", "traj-1", "prompt-2")),
        ("/traj-1/prompt-2/v1/chat/completions", Route("chat", "traj-1", "prompt-2")),
        ("/traj-1/prompt-2/v1/v1/messages", Route("messages", "traj-1", "prompt-2")),
        ("/s/v1/responses", Route("responses", "s", None)),
        ("/s/g/completions", Route("completions", "s", "g")),
        ("/s/chat/completions", None),  # not group "chat" of a legacy completions call
        ("/s/responses", None),
        ("/a/b/c/chat/completions", None),
        ("//g/messages", None),
        ("/v1/embeddings", None),
        # Gemini's paths carry their version and the model; the version stands for /v1
        ("/v1beta/models/gemini-2.5-pro:generateContent", Route("gemini", None, None)),
        ("/v1beta/models/m:streamGenerateContent", Route("gemini_stream", None, None)),
        ("/s/v1beta/models/m:countTokens", Route("gemini_count_tokens", "s", None)),
        ("/s/g/v1beta/models/org/m:generateContent", Route("gemini", "s", "g")),
        ("/s/g/v1/models/m:generateContent", Route("gemini", "s", "g")),
        ("/v1/v1beta/models/m:generateContent", Route("gemini", None, None)),  # a /v1 base URL
        ("/v1beta/models/m:embedContent", None),  # a method no door serves
        ("/a/b/c/v1beta/models/m:generateContent", None),
        ("//g/v1beta/models/m:generateContent", None),
        ("/", None),
        ("/healthz", None),
    ],
)
def test_route(path: str, expected: Route | None) -> None:
    assert route(path) == expected
