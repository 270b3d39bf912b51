"""The stage's speculation helpers on their own: drafts checked, rollbacks bounded (engine/stage/speculate.py)."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache

from orchestrator.engine.stage.speculate import MAX_DRAFT, can_speculate, parse_draft, rollback


def _filled(n: int) -> list[KVCache]:
    cache = [KVCache(), KVCache()]
    for c in cache:
        c.update_and_fetch(mx.zeros((1, 2, n, 4)), mx.zeros((1, 2, n, 4)))
    return cache


@pytest.mark.parametrize("payload", [{}, {"tokens": []}, {"tokens": [1] * (MAX_DRAFT + 1)}, {"tokens": [1, -1]},
                                     {"tokens": [1, 500]}, {"tokens": [True]}, {"tokens": "12"}, [1, 2]])
def test_a_bad_draft_is_refused(payload):
    with pytest.raises(ValueError):
        parse_draft(payload, vocab=500)


def test_a_draft():
    assert parse_draft({"tokens": [0, 499, 7]}, vocab=500) == [0, 499, 7]


def test_rollback_trims_every_layer():
    cache = _filled(10)
    assert rollback(cache, 10, 7, floor=6) == 7
    assert [c.offset for c in cache] == [7, 7]


@pytest.mark.parametrize("to,floor", [(5, 6), (10, 6), (11, 6), (7, None)])
def test_a_rollback_the_last_chunk_does_not_allow_changes_nothing(to, floor):
    cache = _filled(10)
    with pytest.raises(ValueError, match="KV position"):
        rollback(cache, 10, to, floor=floor)
    assert [c.offset for c in cache] == [10, 10]


def test_skip_trim_fault_moves_the_position_only():
    cache = _filled(10)
    assert rollback(cache, 10, 7, floor=6, skip_trim=True) == 7
    assert [c.offset for c in cache] == [10, 10]


def test_which_caches_speculate():
    assert can_speculate([KVCache(), KVCache()])
    assert not can_speculate([KVCache(), RotatingKVCache(max_size=8)])
    assert not can_speculate([KVCache(), ArraysCache(2)])
    assert not can_speculate([])
