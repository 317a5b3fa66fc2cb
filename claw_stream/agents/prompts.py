"""What each coding agent's first request costs in tokens, and what that means on a given
context: `connect` says it when it writes the agent's config, `doctor` when it checks a stack.

Counted from the recorded first requests (tests/fixtures/agents/) by the engine's chat template
with SmolLM2's tokenizer."""

from __future__ import annotations

from dataclasses import dataclass

from claw_stream.agents.target import Target

ANSWER_ROOM = 1024  # tokens left for an answer beside the agent's prompt


@dataclass(frozen=True)
class AgentPrompt:
    agent: str  # as people write it
    name: str  # as `connect` names it
    tokens: int  # its full first prompt
    small: int | None = None  # with the small-model profile connect writes below 32k
    minimum: int = 0  # the context it refuses to start below


AGENT_PROMPTS = (
    AgentPrompt("OpenClaw", "openclaw", 12_700, small=2_700),
    AgentPrompt("Claude Code", "claude-code", 12_200),
    AgentPrompt("Codex", "codex", 9_000),
    AgentPrompt("Gemini CLI", "gemini", 8_600),
    AgentPrompt("opencode", "opencode", 7_600, small=5_300),
    AgentPrompt("aider", "aider", 700),
    AgentPrompt("Hermes Agent", "hermes", 15_100, minimum=64_000),
)
BY_NAME = {a.name: a for a in AGENT_PROMPTS}


def context_to_hold(prompt_tokens: int) -> int:
    """The context a model needs for a prompt and an answer, rounded up to a power of two as
    model cards give it (8k, 16k, 32k, ...)."""
    context = 1024
    while context < prompt_tokens + ANSWER_ROOM:
        context *= 2
    return context


def expectations(name: str, target: Target) -> list[str]:
    """What `connect NAME` should tell the user of the served model, one line each: a context
    that does not hold the agent's first prompt (every call refused), or holds little more;
    and on a CPU engine, how long a prompt that size takes."""
    a = BY_NAME[name]
    if target.context is None:
        return []
    said = []
    elsewhere = "(`claw-stream up --model ORG/NAME` from the hub, or a GPU engine)"
    if a.tokens + ANSWER_ROOM > target.context:
        return [
            f"the model's context ({target.context:,} tokens) does not hold {a.agent}'s first "
            f"prompt (~{a.tokens:,} tokens): the gateway refuses its calls; serve a model of "
            f"{context_to_hold(a.tokens):,} tokens or more {elsewhere}"
        ]
    if target.context < 2 * a.tokens:
        said.append(
            f"the model's context ({target.context:,} tokens) holds {a.agent}'s first prompt "
            f"(~{a.tokens:,} tokens) and little more: a conversation soon does not fit"
        )
    if a.tokens >= 8_000 and target.context <= 32_768:  # a small model, likely on CPU
        # measured on 2 cores: SmolLM2 (16k window) prefilled 12k tokens in 45 s, then wrote
        # 4,130 tokens at ~10 tokens/s: Claude Code's first call took 12.6 minutes
        said.append(
            f"on the built-in CPU engine {a.agent}'s ~{a.tokens // 1000}k-token prompts take "
            "tens of seconds to read and a small model may answer at length at ~10 tokens/s: "
            f"minutes a call; a GPU engine answers in seconds {elsewhere}"
        )
    return said
