"""Stored responses of the Responses API, for `previous_response_id`: bounded, in memory.

A stored response is the conversation it ended (its input and its output, as chat messages,
without its instructions: those are not carried over). Each gateway process keeps its own;
a chain that moves to another process (or outlives `responses_store_size` newer responses)
gets the API's 404 and the client resends its input in full. Each remembers a digest of the key
that created it (`owner`): a session key continues only its own key's conversations. A forget
drops its session's conversations in the process that served it; the others find the session
forgotten when a chain names one of them (`ResponsesDoor`), and drop it then.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection
from typing import Any


class ResponseStore:
    def __init__(self, size: int):
        self.size = size
        self._items: OrderedDict[str, tuple[list[dict[str, Any]], str | None, str | None]] = (
            OrderedDict()
        )

    def put(
        self,
        response_id: str,
        conversation: list[dict[str, Any]],
        owner: str | None = None,
        session_id: str | None = None,
    ) -> None:
        if self.size <= 0:
            return
        self._items[response_id] = (conversation, owner, session_id)
        self._items.move_to_end(response_id)
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def get(self, response_id: str) -> list[dict[str, Any]] | None:
        item = self._items.get(response_id)
        if item is not None:
            self._items.move_to_end(response_id)
            return list(item[0])
        return None

    def forget(self, session_ids: Collection[str]) -> None:
        """Drop the stored conversations of these sessions (forgotten)."""
        gone = set(session_ids)
        for response_id in [r for r, (_, _, s) in self._items.items() if s in gone]:
            del self._items[response_id]

    def session_of(self, response_id: str) -> str | None:
        item = self._items.get(response_id)
        return item[2] if item is not None else None

    def owner(self, response_id: str) -> str | None:
        item = self._items.get(response_id)
        return item[1] if item is not None else None

    def __len__(self) -> int:
        return len(self._items)
