"""Secrets out of a Step's text: patterns and custom redactors, applied before it is published.

Only the text views are redacted (message content, tool-call arguments, reasoning, the strings
of the body's other fields); token ids are never altered, so what is trained is exactly what
the engine sampled. A prompt that held a secret still holds it in its token ids: with
`prompt_secrets: mask` such a Step goes out with no prompt token ids and `train: false`
(archived, never judged or trained).

A match becomes `[REDACTED:<pattern name>]`. Results are cached per text: OpenClaw repeats a
48 KB system prompt on every call; its main-line requests cost 2.2 ms each to redact uncached
and 0.02 ms from the cache (a fresh body per call, as the gateway parses them).
"""

from __future__ import annotations

import importlib
import re
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from claw_stream.api.redaction import REDACTION_ARGUMENTS, RedactionRule
from claw_stream.plugins import misfit

# Literal-first patterns are searched at C speed (tens of µs per 48 KB); a pattern that starts
# with a character class is tried at every position (~1 ms per 48 KB each), so word
# boundaries are checked by a lookbehind after the literal where there is one.
DEFAULT_PATTERNS: dict[str, str] = {
    "api_key": r"sk-(?<![A-Za-z0-9_]sk-)[A-Za-z0-9_-]{20,}",  # OpenAI, Anthropic (sk-ant-...)
    "github_token": r"g(?<![A-Za-z0-9_]g)(?:h[pousr]_[A-Za-z0-9]{36,}|ithub_pat_[A-Za-z0-9_]{22,})",
    "aws_access_key_id": r"A[KS]IA(?<![A-Za-z0-9]A[KS]IA)[0-9A-Z]{16}(?![0-9A-Za-z])",
    "slack_token": r"xox[abprs]-(?<![A-Za-z0-9]xox[abprs]-)[A-Za-z0-9-]{10,}",
    "private_key": r"-----BEGIN[A-Z ]*PRIVATE KEY-----[\s\S]*?-----END[A-Z ]*PRIVATE KEY-----",
    "jwt": r"eyJ(?<![A-Za-z0-9_-]eyJ)[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",
    "bearer_token": r"[Bb]earer(?<![A-Za-z0-9][Bb]earer)[ \t]+[A-Za-z0-9._~+/-]{16,}=*",
    # tried only where a run of local-part characters starts: from every position of a long
    # run (base64, minified code) the scan was quadratic, 0.8 s for 20 KB of one letter.
    # No-reply mailboxes name nobody and are left: every Claude Code prompt carries
    # `Co-Authored-By: Claude Code <noreply@anthropic.com>`, which masked every one of its
    # sessions off training.
    "email": (
        r"(?<![A-Za-z0-9._%+-])(?!(?:no-?reply|do-?not-?reply)@)[A-Za-z0-9._%+-]+@"
        r"[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}(?![A-Za-z0-9-])"
    ),
    # +CC then 7-15 digits (+1 555 123 4567, +44 20 7946 0958, +4915123456789); national:
    # (555) 123-4567, 555-123-4567, 555.123.4567, or 0 then 8-14 digits in groups
    # (06 12 34 56 78, 020 7946 0958, 030 1234567, 0044 20 7946 0958). Plain digit runs (12345, 2024,
    # timestamps) and dates never match: a separator is required.
    "phone": (
        r"\+(?<![\w+]\+)(?=(?:[ .()-]{0,2}\d){7,15})[1-9][\d ().-]{5,20}\d(?![\w-])"
        r"|[(\d](?<![\w.+-][(\d])(?<!\d[ -][(\d])"
        r"(?:(?<=\()\d{3}\)[ ]?\d{3}[-. ]\d{4}"
        r"|(?<=\d)\d\d[-.]\d{3}[-.]\d{4}"
        r"|(?<=0)(?=(?:[ -]?\d){8,14}(?![ -]?\d))\d{0,3}(?:[ -]\d{2,8}){1,4})"
        r"(?![\w-])"
    ),
}

PATTERN_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
Hits = tuple[str, ...]  # the pattern (or redactor) name of each redaction made


class RedactionError(ValueError):
    """A pattern or a redactor that cannot be used; the message names it."""


def compile_patterns(patterns: Mapping[str, str]) -> list[tuple[str, re.Pattern[str]]]:
    """The patterns that are set (an empty one is switched off), compiled; a bad one is a
    `RedactionError` naming it."""
    compiled = []
    for name, pattern in patterns.items():
        if not PATTERN_NAME.fullmatch(name):
            raise RedactionError(
                f"redaction pattern name {name!r}: use 1-64 letters, digits, '_', '.' or '-'"
            )
        if not pattern:
            continue
        try:
            regex = re.compile(pattern)
        except re.error as exc:
            raise RedactionError(
                f"redaction pattern {name!r} ({pattern!r}) is not a valid regular expression: {exc}"
            ) from None
        if regex.fullmatch(""):
            raise RedactionError(f"redaction pattern {name!r} ({pattern!r}) matches empty text")
        compiled.append((name, regex))
    return compiled


def load_redactors(paths: Iterable[str]) -> list[tuple[str, RedactionRule]]:
    """Custom redactors by import path `module:function`: a `claw_stream.api.RedactionRule`, a
    function of the text alone (its results are cached), returning the text redacted
    (docs/extending/redaction.md)."""
    loaded = []
    for path in paths:
        module_name, _, attribute = path.partition(":")
        if not module_name or not attribute:
            raise RedactionError(f"redactor {path!r}: give it as 'module:function'")
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:
            raise RedactionError(
                f"redactor {path!r}: cannot import {module_name}: {exc!r}"
            ) from None
        function = getattr(module, attribute, None)
        if not callable(function):
            raise RedactionError(f"redactor {path!r}: {module_name} has no function {attribute}")
        if (problem := misfit(function, REDACTION_ARGUMENTS)) is not None:
            raise RedactionError(f"redactor {path!r}: {problem}")
        loaded.append((path, function))
    return loaded


@dataclass(frozen=True)
class Redacted:
    text: str
    hits: Hits


class Redactor:
    """Redacts texts with the patterns, then the custom redactors; results of texts seen
    before come from an LRU cache bounded by the characters it holds."""

    def __init__(
        self,
        patterns: Mapping[str, str],
        redactors: Iterable[str] = (),
        *,
        mask_prompts: bool = True,
        cache_chars: int = 32_000_000,
        on_hits: Callable[[Hits], None] | None = None,
    ):
        self.patterns = compile_patterns(patterns)
        self.redactors = load_redactors(redactors)
        self.mask_prompts = mask_prompts
        self.cache_chars = cache_chars
        self.on_hits = on_hits  # each redaction made, counted (cached or not)
        self._cache: OrderedDict[str, Redacted] = OrderedDict()
        self._chars = 0
        self.lookups = 0
        self.misses = 0

    def text(self, text: str, *, cache: bool = True) -> Redacted:
        self.lookups += 1
        found = self._cache.get(text) if cache else None
        if found is not None:
            self._cache.move_to_end(text)
        else:
            self.misses += 1
            found = self._scan(text)
            if cache and len(text) <= self.cache_chars:
                self._remember(text, found)
        if found.hits and self.on_hits is not None:
            self.on_hits(found.hits)
        return found

    def _scan(self, text: str) -> Redacted:
        hits: list[str] = []
        for name, regex in self.patterns:
            replacement = f"[REDACTED:{name}]"

            def replace(
                match: re.Match[str], name: str = name, replacement: str = replacement
            ) -> str:
                if match.end() == match.start():
                    return ""
                hits.append(name)
                return replacement

            text = regex.sub(replace, text)
        for path, function in self.redactors:
            try:
                changed = function(text)
            except Exception as exc:
                raise RedactionError(f"redactor {path!r} failed: {exc!r}") from exc
            if not isinstance(changed, str):
                raise RedactionError(
                    f"redactor {path!r} returned {type(changed).__name__}, not str"
                )
            if changed != text:
                hits.append(path)
                text = changed
        return Redacted(text, tuple(hits))

    def _remember(self, text: str, found: Redacted) -> None:
        self._cache[text] = found
        self._chars += len(text) + (len(found.text) if found.hits else 0)
        while self._chars > self.cache_chars and self._cache:
            old, was = self._cache.popitem(last=False)
            self._chars -= len(old) + (len(was.text) if was.hits else 0)

    def message(self, message: dict[str, Any]) -> Hits:
        """Redact a Step's message (as `capture._message` builds it) in place: its content,
        reasoning and tool-call arguments; the redactions made."""
        hits: Hits = ()
        for key in ("content", "reasoning_content"):
            value = message.get(key)
            if value:
                found = self.text(value)
                message[key] = found.text
                hits += found.hits
        for call in message.get("tool_calls") or ():
            function = call["function"]
            if function["arguments"]:
                found = self.text(function["arguments"])
                function["arguments"] = found.text
                hits += found.hits
        return hits

    def strings(self, value: Any) -> tuple[Any, Hits]:
        """`value` (JSON: the body's other fields, such as OpenAI's `user`, often an email
        address) with every string in it redacted; the redactions made."""
        if isinstance(value, str):
            found = self.text(value)
            return found.text, found.hits
        hits: Hits = ()
        if isinstance(value, dict):
            out = {}
            for key, item in value.items():
                out[key], more = self.strings(item)
                hits += more
            return out, hits
        if isinstance(value, list):
            items = []
            for item in value:
                redacted, more = self.strings(item)
                items.append(redacted)
                hits += more
            return items, hits
        return value, hits

    def messages(self, messages: Iterable[dict[str, Any]]) -> Hits:
        hits: Hits = ()
        for message in messages:
            hits += self.message(message)
        return hits
