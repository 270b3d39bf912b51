"""Affinity keys and the bounded affinity table (pure, no I/O)."""

from __future__ import annotations

import pytest

from orchestrator.router.affinity import AffinityTable, affinity_key, conversation_head
from orchestrator.router.config import ConfigError, parse_config

SYS = {"role": "system", "content": "be brief"}


def _chat_key(messages: list, model: str = "m", header: str | None = None) -> str | None:
    return affinity_key("/v1/chat/completions", {"model": model, "messages": messages}, model, header, 100)


def test_every_turn_of_a_chat_has_the_key_of_its_first_turn():
    first = [SYS, {"role": "user", "content": "hi"}]
    later = [*first, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
    assert _chat_key(first) == _chat_key(later) is not None
    assert _chat_key([SYS, {"role": "user", "content": "other"}]) != _chat_key(first)
    assert _chat_key(first, model="n") != _chat_key(first)  # never shared across models
    parts = [SYS, {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert _chat_key(parts) == _chat_key([*parts, {"role": "assistant", "content": "x"}])


def test_the_header_wins_and_requests_without_a_head_have_no_key():
    assert _chat_key([{"role": "user", "content": "a"}], header="s") == _chat_key([], header="s")
    assert _chat_key([{"role": "user", "content": "a"}], header="  ") == _chat_key([{"role": "user", "content": "a"}])
    assert _chat_key([]) is None
    assert _chat_key([{"role": "assistant", "content": "a"}]) is None
    assert _chat_key("not a list") is None  # type: ignore[arg-type]
    assert affinity_key("/v1/embeddings", {"input": "x"}, "m", None, 100) is None
    assert affinity_key("/v1/chat/completions", ["not", "an", "object"], "m", None, 100) is None


def test_heads_of_the_other_apis():
    msgs = {"system": "s", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    assert conversation_head("/v1/messages", msgs, 10) == conversation_head(
        "/v1/messages", {**msgs, "messages": msgs["messages"][:1]}, 10)
    assert conversation_head("/v1/responses", {"instructions": "i", "input": "x" * 50}, 10) == \
        conversation_head("/v1/responses", {"instructions": "i", "input": "x" * 10 + "y"}, 10)
    assert conversation_head("/v1/completions", {"prompt": "abcdefgh"}, 4) == \
        conversation_head("/v1/completions", {"prompt": "abcdXYZ"}, 4)
    assert conversation_head("/v1/completions", {"prompt": ""}, 4) is None


def test_the_table_is_bounded_least_recently_used_out_first():
    t = AffinityTable(2)
    t.put("k1", "a")
    t.put("k2", "b")
    assert t.get("k1") == "a"  # k1 used: k2 is now the oldest
    t.put("k3", "a")
    assert (t.get("k2"), t.get("k1"), t.get("k3"), len(t)) == (None, "a", "a", 2)
    t.put("k1", "b")
    assert t.get("k1") == "b"
    t.resize(1)
    assert len(t) == 1 and t.get("k1") == "b"
    with pytest.raises(ValueError):
        AffinityTable(0)


def test_the_yaml_section_is_validated():
    cfg = parse_config("prefix_affinity: {enabled: true, header: X-Session, max_entries: 5}")
    assert (cfg.prefix_affinity.enabled, cfg.prefix_affinity.header, cfg.prefix_affinity.max_entries) == \
        (True, "X-Session", 5)
    assert parse_config("prefix_affinity:").prefix_affinity.enabled is False
    with pytest.raises(ConfigError, match="prefix_affinity.max_entries"):
        parse_config("prefix_affinity: {max_entries: 0}")
    with pytest.raises(ConfigError, match="header"):
        parse_config("prefix_affinity: {header: 'bad header'}")
