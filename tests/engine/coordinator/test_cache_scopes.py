"""Prompt-cache scopes (issue 39, item 1), the bookkeeping: the prefix index plans a prompt from
entries of its own scope only, and the disk tier keeps each file's scope, so an entry adopted
after a restart goes back to the scope that wrote it. The attack itself runs through a real
router and coordinator in tests/router/test_cache_scopes.py."""

from __future__ import annotations

import mlx.core as mx
import pytest

from orchestrator.cache_scope import ScopeError, caller_of, caller_scope, request_scope
from orchestrator.engine.coordinator.disk_adoption import Adoptable, DiskAdoption
from orchestrator.engine.coordinator.prefix_index import PrefixIndex, Reuse
from orchestrator.engine.stage.disk_cache import DiskTier
from orchestrator.engine.stage.shard import StageModel
from orchestrator.logs import EventLogger

PROMPT = list(range(1, 30))


def _stored(index: PrefixIndex, tokens: list[int], scope: str) -> int:
    entry = index.add(tokens, "assistant", scope)
    for stage in range(index.stages):
        index.stored(stage, entry, 10, True, len(tokens))
    return entry


def test_a_prompt_is_planned_from_its_own_scopes_entries_only():
    index = PrefixIndex(2, 1000)
    a = _stored(index, PROMPT, "alice")
    assert index.plan(PROMPT + [99], "bob") is None  # the same prompt, another scope: nothing
    assert index.plan(PROMPT[:10] + [0], "bob") is None and index.plan(PROMPT + [99]) is None
    assert index.plan(PROMPT + [99], "alice") == Reuse(a, len(PROMPT))
    b = _stored(index, PROMPT, "bob")  # bob's own copy: his to reuse, and it leaves alice's alone
    assert index.plan(PROMPT + [99], "bob") == Reuse(b, len(PROMPT))
    assert index.plan(PROMPT + [99], "alice") == Reuse(a, len(PROMPT))
    longer = _stored(index, PROMPT + [5, 6], "alice")  # makes alice's shorter entry redundant, not bob's
    assert a not in index._entries and b in index._entries and longer in index._entries
    index.remove(longer)
    index.remove(b)
    assert index._roots == {}  # a scope's trie goes with its last entry


def test_scopes_come_from_the_router_header_and_the_cache_salt():
    assert request_scope(None, None) == "" and request_scope("", "") == ""
    scopes = {request_scope("a", None), request_scope("b", None), request_scope(None, "a"),
              request_scope("a", "x"), request_scope("b", "x")}
    assert len(scopes) == 5 and "" not in scopes  # a caller's and a salt's never coincide
    for bad in (1, ["x"], {"a": 1}, "x" * 5000):
        with pytest.raises(ScopeError) as err:
            request_scope(None, bad)
        assert err.value.param == "cache_salt"
    assert caller_of({"Authorization": "Bearer sk-1"}, None) == "sk-1"
    assert caller_of({"x-api-key": "sk-2"}, None) == "sk-2"
    assert caller_of({"Authorization": "Basic x"}, None) is None and caller_of({}, None) is None
    assert caller_of({"X-User": "ann", "Authorization": "Bearer sk-1"}, "X-User") == "ann"
    assert caller_of({"Authorization": "Bearer sk-1"}, "X-User") is None
    assert caller_scope("sk-1") != caller_scope("sk-2") and "sk-1" not in caller_scope("sk-1")


def test_disk_files_keep_their_scope_and_are_adopted_back_into_it(test_model_dir, tmp_path):
    stage = StageModel(test_model_dir, 0, 4)
    cache = stage.make_cache()
    stage.forward(mx.array(PROMPT)[None], cache)
    mx.eval([c.state for c in cache])
    tier = DiskTier(tmp_path, test_model_dir, (0, 4), 1 << 30, stage.make_cache, EventLogger("test-scopes"))
    tier.write(PROMPT, cache, "assistant", "alice")
    tier.write(PROMPT, cache, "assistant", "bob")
    tier.write(PROMPT, cache, "assistant")
    files = tier.scan()
    assert sorted(e.scope for e in files) == ["", "alice", "bob"]  # one file per scope, same tokens
    assert len({e.key for e in files}) == 3
    listed = [[e.key, list(e.tokens), e.kind, e.nbytes, e.scope] for e in files]
    adoption = DiskAdoption(1, 1 << 30)
    got = adoption.offer(0, listed)
    assert sorted((a.scope, a.tokens) for a in got) == [(s, tuple(PROMPT)) for s in ("", "alice", "bob")]
    index = PrefixIndex(1, 1 << 30)
    ids = {a.scope: index.add(list(a.tokens), a.kind, a.scope) for a in got}
    assert index.plan(PROMPT + [1], "alice") == Reuse(ids["alice"], len(PROMPT))
    assert index.plan(PROMPT + [1], "carol") is None
    # A stage whose file lists another scope for a key does not make it adoptable.
    two = DiskAdoption(2, 1 << 30)
    two.offer(0, [[files[0].key, list(PROMPT), "assistant", 1, "alice"]])
    assert two.offer(1, [[files[0].key, list(PROMPT), "assistant", 1, "bob"]]) == []
    assert DiskAdoption(1, 1 << 30).offer(0, [["k", [1], "user", 1]]) == [Adoptable("k", (1,), "user")]
    with pytest.raises(ValueError):
        DiskAdoption(1, 1 << 30).offer(0, [["k", [1]]])
