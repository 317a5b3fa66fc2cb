"""Stored responses of the Responses API, for `previous_response_id`: bounded, in memory.

A stored response is the conversation it ended (its input and its output, as chat messages,
without its instructions: those are not carried over). Each gateway process keeps its own;
a chain that moves to another process (or outlives `responses_store_size` newer responses)
gets the API's 404 and the client resends its input in full.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any


class ResponseStore:
    def __init__(self, size: int):
        self.size = size
        self._items: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()

    def put(self, response_id: str, conversation: list[dict[str, Any]]) -> None:
        if self.size <= 0:
            return
        self._items[response_id] = conversation
        self._items.move_to_end(response_id)
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def get(self, response_id: str) -> list[dict[str, Any]] | None:
        conversation = self._items.get(response_id)
        if conversation is not None:
            self._items.move_to_end(response_id)
            return list(conversation)
        return None

    def __len__(self) -> int:
        return len(self._items)
