"""Edits of a JSON-with-comments file (JSONC: `//` and `/* */` comments, trailing commas) that
leave the rest of its text as it was: a member's value replaced, a member added at the end of
its object, a member taken out. Everything outside the edited span keeps its bytes, comments
and order; a value written is indented like the members around it.

`read` gives the file's data (json5 reads JSONC); `set_member` and `remove_member` take a path
of keys from the top-level object.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import json5

from claw_stream.agents.target import AgentConfigFileError, one_line


class JSONCError(AgentConfigFileError):
    """Text that is not a JSONC object; the message is one line."""


@dataclass
class _Member:
    key: str
    start: int  # where its key's opening quote is
    value: _Value


@dataclass
class _Value:
    start: int
    end: int  # one past its last character
    members: list[_Member] = field(default_factory=list)  # an object's, in order
    close: int = -1  # an object's closing brace
    is_object: bool = False


_SPACE = re.compile(r"(?:\s+|//[^\n]*|/\*.*?\*/)*", re.DOTALL)
_SCALAR = re.compile(r"-?[0-9][0-9.eE+-]*|true|false|null|-?Infinity|NaN")


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.at = 0

    def skip(self) -> None:
        self.at = _SPACE.match(self.text, self.at).end()  # type: ignore[union-attr]

    def fail(self, what: str) -> JSONCError:
        line = self.text.count("\n", 0, self.at) + 1
        return JSONCError(f"not valid JSON: {what} at line {line}")

    def string(self) -> tuple[str, int]:
        start, quote = self.at, self.text[self.at]
        at = start + 1
        while at < len(self.text) and self.text[at] != quote:
            at += 2 if self.text[at] == "\\" else 1
        if at >= len(self.text):
            raise self.fail("an unterminated string")
        self.at = at + 1
        return json5.loads(self.text[start : self.at]), start

    def value(self) -> _Value:
        self.skip()
        start = self.at
        char = self.text[start : start + 1]
        if char == "{":
            return self.object()
        if char == "[":
            self.at += 1
            self.skip()
            while self.text[self.at : self.at + 1] != "]":
                self.value()
                self.skip()
                if self.text[self.at : self.at + 1] == ",":
                    self.at += 1
                    self.skip()
                elif self.text[self.at : self.at + 1] != "]":
                    raise self.fail("expected , or ]")
            self.at += 1
            return _Value(start, self.at)
        if char in ("'", '"'):
            self.string()
            return _Value(start, self.at)
        found = _SCALAR.match(self.text, start)
        if found is None or found.end() == start:
            raise self.fail("expected a value")
        self.at = found.end()
        return _Value(start, self.at)

    def object(self) -> _Value:
        node = _Value(self.at, -1, is_object=True)
        self.at += 1
        self.skip()
        while self.text[self.at : self.at + 1] != "}":
            if self.text[self.at : self.at + 1] not in ("'", '"'):
                raise self.fail("expected a quoted key")
            key, start = self.string()
            self.skip()
            if self.text[self.at : self.at + 1] != ":":
                raise self.fail("expected :")
            self.at += 1
            node.members.append(_Member(key, start, self.value()))
            self.skip()
            if self.text[self.at : self.at + 1] == ",":
                self.at += 1
                self.skip()
            elif self.text[self.at : self.at + 1] != "}":
                raise self.fail("expected , or }")
        node.close = self.at
        self.at += 1
        node.end = self.at
        return node


def read(text: str) -> dict[str, Any]:
    """The file's data ({} for an empty file); JSONCError when it is not a JSONC object."""
    if not text.strip():
        return {}
    try:
        data = json5.loads(text)
    except ValueError as exc:
        raise JSONCError(f"not valid JSON: {one_line(exc)}") from None
    if not isinstance(data, dict):
        raise JSONCError("expected a JSON object")
    return data


def _root(text: str) -> _Value:
    parser = _Parser(text)
    root = parser.value()
    if not root.is_object:
        raise JSONCError("expected a JSON object")
    return root


def _unit(text: str) -> str:
    """The indentation step the file uses (two spaces where it says nothing)."""
    found = re.search(r"^([ \t]+)\S", text, re.MULTILINE)
    return found.group(1) if found else "  "


def _column(text: str, at: int) -> str | None:
    """The whitespace before `at` on its line, where only whitespace is there."""
    line_start = text.rfind("\n", 0, at) + 1
    before = text[line_start:at]
    return before if not before.strip() else None


def _dumps(value: Any, unit: str, indent: str) -> str:
    """`value` as JSON, nested by `unit`, its later lines indented by `indent`."""
    return json.dumps(value, indent=unit, ensure_ascii=False).replace("\n", "\n" + indent)


def _find(root: _Value, path: tuple[str, ...]) -> tuple[_Value, int, _Member | None]:
    """The deepest object on `path`, how many keys of it lead there, and the member found last
    (None when the path stops before its end)."""
    node, depth, member = root, 0, None
    for key in path:
        found = next((m for m in reversed(node.members) if m.key == key), None)
        if found is None:
            return node, depth, None
        depth, member = depth + 1, found
        if depth < len(path):
            if not found.value.is_object:
                raise JSONCError(f"`{'.'.join(path[:depth])}` is not an object")
            node = found.value
    return node, depth, member


def set_member(text: str, path: tuple[str, ...], value: Any) -> str:
    """`text` with the member at `path` set to `value` (objects on the way created)."""
    if not text.strip():
        text = "{}\n"
    root, unit = _root(text), _unit(text)
    node, depth, member = _find(root, path)
    if depth == len(path) and member is not None:
        column = _column(text, member.start)
        indent = _line_indent(text, member.start) if column is None else column
        replaced = _dumps(value, unit, indent)
        return text[: member.value.start] + replaced + text[member.value.end :]
    for key in reversed(path[depth + 1 :]):
        value = {key: value}
    return _add(text, node, path[depth], value, unit)


def _line_indent(text: str, at: int) -> str:
    """The whitespace that begins the line `at` is on."""
    line_start = text.rfind("\n", 0, at) + 1
    return re.match(r"[ \t]*", text[line_start:]).group()  # type: ignore[union-attr]


def _comma_after(text: str, value: _Value) -> int | None:
    """Where the comma after a member's value is, if one follows it."""
    after = _SPACE.match(text, value.end).end()  # type: ignore[union-attr]
    return after if text[after : after + 1] == "," else None


def _add(text: str, node: _Value, key: str, value: Any, unit: str) -> str:
    """A member added at the end of the object `node`, on a line of its own."""
    outer = _line_indent(text, node.start)
    if not node.members:
        indent = outer + unit
        entry = f"\n{indent}{json.dumps(key)}: {_dumps(value, unit, indent)}\n{outer}"
        if text[node.start + 1 : node.close].strip():  # only comments in it: after them
            return text[: node.close].rstrip() + entry + text[node.close :]
        return text[: node.start + 1] + entry + text[node.close :]
    last = node.members[-1]
    column = _column(text, last.start)
    indent = outer + unit if column is None else column
    entry = f"\n{indent}{json.dumps(key)}: {_dumps(value, unit, indent)}"
    comma = _comma_after(text, last.value)
    if comma is None:
        head, rest = text[: last.value.end] + ",", last.value.end
    else:
        head, rest = text[: comma + 1], comma + 1
    line_end = text.find("\n", rest)
    line_end = len(text) if line_end < 0 else line_end
    tail = text[rest:line_end]
    if not tail.strip() or tail.strip().startswith("//"):  # the line's own comment stays on it
        return head + tail + entry + text[line_end:]
    return head + entry + text[rest:]


def remove_member(text: str, path: tuple[str, ...]) -> str:
    """`text` without the member at `path` (as it was where there is none), and without its
    line where it had one of its own."""
    if not text.strip():
        return text
    node, depth, member = _find(_root(text), path)
    if depth < len(path) or member is None:
        return text
    index = next(i for i, m in enumerate(node.members) if m is member)
    comma = _comma_after(text, member.value)
    start, end = member.start, (comma + 1 if comma is not None else member.value.end)
    line_end = text.find("\n", end)
    line_end = len(text) if line_end < 0 else line_end
    indent = _column(text, member.start)
    tail = text[end:line_end].strip()
    if indent is not None and (not tail or tail.startswith("//")):  # a line of its own
        start, end = member.start - len(indent), min(line_end + 1, len(text))
    if comma is None and index > 0:  # it was the last: the comma before it goes too
        before = _comma_after(text, node.members[index - 1].value)
        if before is not None:
            return text[:before] + text[before + 1 : start] + text[end:]
    return text[:start] + text[end:]
