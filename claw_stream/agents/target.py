"""What every agent's config writer shares: what an agent needs to reach the gateway
(`Target`), our provider's id in its config, and the error of a file that cannot be read."""

from __future__ import annotations

from dataclasses import dataclass

PROVIDER = "claw-stream"  # our provider's id in each agent's config
# below this many tokens of context an agent's full prompt does not fit (OpenClaw's ~12.7k,
# 15k after two tool calls): its small-model profile is written
SMALL_CONTEXT = 32_768


class AgentConfigFileError(Exception):
    """An agent's config file that cannot be read; the message is one line."""


@dataclass(frozen=True)
class Target:
    """What an agent needs to reach the gateway."""

    base_url: str  # the gateway's root, no /v1
    key: str
    model: str  # the name the gateway lists for the served model
    context: int | None  # its context window in tokens, where the gateway says
    max_tokens: int | None = None  # the longest answer to ask for; None: a share of `context`

    @property
    def answer_tokens(self) -> int | None:
        """The answer limit an agent should ask for: `max_tokens`, else a quarter of the
        context, at most 8,192 (the gateway lowers a larger ask to the room a prompt leaves)."""
        if self.max_tokens is not None:
            return self.max_tokens
        return None if self.context is None else max(1, min(8192, self.context // 4))

    @property
    def small(self) -> bool:
        """Whether the model's context is below what an agent's full prompt needs."""
        return self.context is not None and self.context < SMALL_CONTEXT


def one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())
