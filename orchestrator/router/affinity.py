"""Prefix-aware routing: a conversation goes back to the backend that holds its prefix.

Each backend (a pipeserve coordinator) keeps a prompt cache of the conversations it served
(docs/prompt-cache.md); a second turn sent to another backend of the same model would pay
the whole prefill again. The router cannot see those caches, so it remembers where it sent
each conversation: the *affinity key* of a request is an explicit header (a client that
names its session), else a hash of the text that starts the conversation and stays the same
on every turn — the system prompt and the first user message (for `/v1/completions` the
first characters of the prompt). `AffinityTable` maps keys to backend names, bounded, least
recently used out first.

`affinity_key` is pure; the table is the only state, one per router process.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from typing import Any, Mapping


def _canonical(value: Any) -> str:
    """Stable text for a message's content (a string, or a list of parts as JSON)."""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False)


def _chat_head(messages: Any) -> list[Any] | None:
    """The leading system/developer messages and the first user message's content."""
    if not isinstance(messages, list):
        return None
    head: list[Any] = []
    for m in messages:
        if not isinstance(m, dict):
            return None
        role = m.get("role")
        if role in ("system", "developer"):
            head.append([role, m.get("content")])
        elif role == "user":
            head.append(["user", m.get("content")])
            return head
        else:
            return None  # an assistant turn before any user turn: no stable head to key on
    return None


def conversation_head(path: str, doc: Mapping[str, Any], prefix_chars: int) -> str | None:
    """The text that starts the conversation of a request body, or None when it has none.

    Chat Completions: the system/developer messages up to and including the first user
    message. Anthropic Messages: `system` and the first message. Responses: `instructions`
    and the first input item (the whole input when it is a string, cut to `prefix_chars`).
    Completions: the first `prefix_chars` characters of the prompt (a conversation's prompt
    grows at its end, so its start stays the same).
    """
    route = path.split("?")[0].rstrip("/")
    if route == "/v1/chat/completions":
        head = _chat_head(doc.get("messages"))
    elif route == "/v1/messages":
        msgs = doc.get("messages")
        first = msgs[0] if isinstance(msgs, list) and msgs and isinstance(msgs[0], dict) else None
        head = [doc.get("system"), first.get("content")] if first and first.get("role") == "user" else None
    elif route == "/v1/responses":
        inp = doc.get("input")
        if isinstance(inp, str):
            head = [doc.get("instructions"), inp[:prefix_chars]]
        elif isinstance(inp, list) and inp:
            head = [doc.get("instructions"), inp[0]]
        else:
            head = None
    elif route == "/v1/completions":
        prompt = doc.get("prompt")
        head = [prompt[:prefix_chars]] if isinstance(prompt, str) and prompt else None
    else:
        head = None
    return None if head is None else _canonical(head)


def affinity_key(path: str, doc: Any, model: str, header_value: str | None, prefix_chars: int,
                 scope: str = "") -> str | None:
    """The request's affinity key: its header's value, else its conversation head's hash.

    The model is part of the key: one conversation text sent to two models is two
    conversations; so is the caller's prompt-cache `scope`: one caller's conversation never
    steers another's. None when the request has neither (it is balanced as usual).
    """
    if header_value is not None and header_value.strip():
        text = "header\0" + header_value.strip()
    elif isinstance(doc, dict) and (head := conversation_head(path, doc, prefix_chars)) is not None:
        text = "head\0" + path.split("?")[0].rstrip("/") + "\0" + head
    else:
        return None
    scoped = f"scope\0{scope}\0" if scope else ""  # the default scope keeps its keys as before
    return hashlib.sha256(f"{scoped}{model}\0{text}".encode()).hexdigest()


class AffinityTable:
    """key → backend name, at most `max_entries`, least recently used evicted; thread-safe."""

    def __init__(self, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError("an affinity table holds at least one entry")
        self._max = max_entries
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, str] = OrderedDict()

    def get(self, key: str) -> str | None:
        """The backend `key` was last sent to (and mark it recently used), or None."""
        with self._lock:
            name = self._entries.get(key)
            if name is not None:
                self._entries.move_to_end(key)
            return name

    def put(self, key: str, backend: str) -> None:
        """Remember that `key` went to `backend`."""
        with self._lock:
            self._entries[key] = backend
            self._entries.move_to_end(key)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)

    def resize(self, max_entries: int) -> None:
        """Adopt a reloaded bound (evicting the oldest entries past it)."""
        if max_entries < 1:
            raise ValueError("an affinity table holds at least one entry")
        with self._lock:
            self._max = max_entries
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
