"""Rolling a request's caches back after a verification chunk (engine/stage/rewind.py), on its own.

Plain KV trims; a recurrent state and a full sliding window go back through a rewind point and a replay.
The replayed caches are compared with caches that ran the accepted positions directly (the family matrix's
token comparison is tests/engine/test_speculation_families.py). A window that one-position steps write in
place (a stepwise family's verification and replay) is held by the rewind point as arrays of its own.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache

from orchestrator.engine.stage import rewind
from orchestrator.engine.stage.batch import restore, snapshot
from orchestrator.engine.stage.rewind import Rewind, Rollback, rollback_for, rollback_of, trims
from orchestrator.engine.stage.shard import StageModel

PROMPT = [(i * 37 + 11) % 500 for i in range(30)]
CHUNK = [7, 8, 9, 10, 11]  # the last accepted token and four drafts


def _filled(n: int) -> list[KVCache]:
    cache = [KVCache(), KVCache()]
    for c in cache:
        c.update_and_fetch(mx.zeros((1, 2, n, 4)), mx.zeros((1, 2, n, 4)))
    return cache


def _verified(rw: Rewind, cache: list, position: int, tokens: list[int], model: StageModel | None = None) -> int:
    """Run `tokens` as a verification chunk from `position` (through `model` when given); the new position."""
    x = mx.array(tokens)[None]
    x, start = rw.prepare(cache, position, x, True, model.forward if model else None)
    if model is not None:
        mx.eval(rw.forward(model.forward, x, cache), [c.state for c in cache])
    rw.ran(position, True)
    return start + int(x.shape[1])


def test_which_caches_trim():
    assert trims([KVCache(), KVCache()])
    assert not trims([KVCache(), RotatingKVCache(max_size=8)])
    assert not trims([KVCache(), ArraysCache(2)])
    assert not trims([])


def test_plain_kv_trims_every_layer():
    cache = _filled(10)
    rw = Rewind(Rollback(rollback_of(cache)))
    rw.ran(5, True)  # a chunk from position 5 ran
    assert rw.back(cache, 10, 7) == 7
    assert [c.offset for c in cache] == [7, 7] and rw.pending == 0


@pytest.mark.parametrize("to,verified", [(5, True), (10, True), (11, True), (7, False)])
def test_a_rollback_the_last_chunk_does_not_allow_changes_nothing(to, verified):
    cache = _filled(10)
    rw = Rewind(Rollback(rollback_of(cache)))
    if verified:
        rw.ran(5, True)
    with pytest.raises(ValueError, match="KV position"):
        rw.back(cache, 10, to)
    assert [c.offset for c in cache] == [10, 10]


def test_skip_trim_fault_moves_the_position_only():
    cache = _filled(10)
    rw = Rewind(Rollback(rollback_of(cache)))
    rw.ran(5, True)
    assert rw.back(cache, 10, 7, skip_trim=True) == 7
    assert [c.offset for c in cache] == [10, 10]


def _states(cache: list) -> list[np.ndarray]:
    out = []
    for c in cache:
        for a in (c.state if isinstance(c.state, (list, tuple)) else [c.state]):
            if isinstance(a, mx.array):
                out.append(np.array(a))
    return out


@pytest.mark.parametrize("family", ["mamba2", "gemma3_text"])  # a recurrent state; full sliding windows
def test_a_replayed_rollback_leaves_the_caches_of_the_accepted_positions(family_model, family):
    model = StageModel(family_model(family), 0, 2)
    cache, direct = model.make_cache(), model.make_cache()
    for c in (cache, direct):
        mx.eval(model.forward(mx.array(PROMPT)[None], c), [x.state for x in c])
    rw = Rewind(Rollback(rollback_of(cache)))
    assert not rw.trims
    position = _verified(rw, cache, len(PROMPT), CHUNK, model)
    assert rw.back(cache, position, len(PROMPT) + 3) == len(PROMPT)  # two drafts accepted
    assert rw.pending == 3
    assert rw.settle(cache, len(PROMPT), model.forward) == len(PROMPT) + 3
    mx.eval(model.forward(mx.array(CHUNK[:3])[None], direct), [c.state for c in cache], [c.state for c in direct])
    for a, b in zip(_states(cache), _states(direct)):
        np.testing.assert_allclose(a, b, atol=1e-4)


@pytest.mark.parametrize("family", ["mamba2", "gemma3_text"])
def test_the_replay_runs_in_front_of_the_next_input_and_its_output_is_dropped(family_model, family):
    model = StageModel(family_model(family), 0, 2)
    cache = model.make_cache()
    mx.eval(model.forward(mx.array(PROMPT)[None], cache), [c.state for c in cache])
    rw = Rewind(Rollback(rollback_of(cache)))
    position = rw.back(cache, _verified(rw, cache, len(PROMPT), CHUNK, model), len(PROMPT) + 1)
    x, start = rw.prepare(cache, position, mx.array([[42]]), False, model.forward)
    assert (start, rw.drop, int(x.shape[1])) == (len(PROMPT), 1, 2)
    assert rw.forward(model.forward, x, cache).shape[1] == 1
    assert rw.point is None and rw.pending == 0  # a plain step: no rollback may follow it


def test_a_long_replay_runs_on_its_own_before_the_next_verification(family_model, monkeypatch):
    monkeypatch.setattr(rewind, "REPLAY_MAX", 6)
    model = StageModel(family_model("mamba2"), 0, 2)
    cache = model.make_cache()
    mx.eval(model.forward(mx.array(PROMPT)[None], cache), [c.state for c in cache])
    rw = Rewind(Rollback(rollback_of(cache)))
    position = rw.back(cache, _verified(rw, cache, len(PROMPT), CHUNK, model), len(PROMPT) + 4)
    ran: list[int] = []

    def forward(x, c):
        ran.append(int(x.shape[1]))
        return model.forward(x, c)

    x, start = rw.prepare(cache, position, mx.array([CHUNK]), True, forward)
    assert ran == [4] and (start, rw.drop, int(x.shape[1])) == (len(PROMPT) + 4, 0, 5)
    assert rw.point is not None and rw.point.position == len(PROMPT) + 4


def test_a_replaying_stage_without_a_rewind_point_refuses():
    cache = [ArraysCache(1)]
    rw = Rewind(None)  # a stage that refuses speculation never takes one
    x, start = rw.prepare(cache, 3, mx.array([CHUNK]), True, None)
    assert rw.point is None and rw.drop == 0
    rw.ran(3, True)
    with pytest.raises(ValueError, match="no rewind point"):
        rw.back(cache, 8, 5)


def _full_window() -> RotatingKVCache:
    """A window of 4 that six one-position steps filled and rotated: the next step writes in place."""
    c = RotatingKVCache(max_size=4)
    for i in range(6):
        c.update_and_fetch(mx.full((1, 1, 1, 2), float(i)), mx.full((1, 1, 1, 2), float(i)))
    mx.eval(c.keys, c.values)
    return c


def _steps(c: RotatingKVCache, values: list[float]) -> None:
    for v in values:
        c.update_and_fetch(mx.full((1, 1, 1, 2), v), mx.full((1, 1, 1, 2), v))
    mx.eval(c.keys, c.values)


def test_a_held_snapshot_keeps_a_full_window_that_one_position_steps_write_in_place():
    """A rewind point holds a window's arrays as objects of its own: after one-position steps (which
    write `keys[..., i, :]` in place, rebinding the very array object) restoring gives the old values,
    again after a second round; a plain reference (batch.py's own use) would give the new ones."""
    c = _full_window()
    old = np.array(c.keys)
    saved, shared = snapshot([[c]], held=True), snapshot([[c]])
    for _ in range(2):
        _steps(c, [10.0, 11.0, 12.0])
        assert not np.array_equal(np.array(c.keys), old)
        restore([[c]], saved, held=True)
        np.testing.assert_array_equal(np.array(c.keys), old)
        np.testing.assert_array_equal(np.array(c.values), old)
        assert c.offset == 6
    _steps(c, [10.0])
    restore([[c]], shared)
    assert not np.array_equal(np.array(c.keys), old)  # why the point must hold its own objects


def test_a_stepwise_rollback_leaves_the_caches_of_the_accepted_steps(family_model):
    """PLaMo 3 (windows of 8 that the prompt overflows) verifies one position at a time: rolled back and
    replayed, its caches are bit for bit those of decode steps of the accepted positions."""
    model = StageModel(family_model("plamo3"), 0, 6)
    cache, direct = model.make_cache(), model.make_cache()
    for c in (cache, direct):  # a decode step after the prompt: the windows' buffers are those steps write into
        mx.eval(model.forward(mx.array(PROMPT)[None], c), model.forward(mx.array([[3]]), c), [x.state for x in c])
    at = len(PROMPT) + 1
    rw = Rewind(rollback_for(model))
    assert rw.rollback.stepwise and not rw.trims
    ran: list[int] = []

    def forward(x, c):
        ran.append(int(x.shape[1]))
        return model.forward(x, c)

    x, start = rw.prepare(cache, at, mx.array([CHUNK]), True, forward)
    mx.eval(rw.forward(forward, x, cache), [c.state for c in cache])
    rw.ran(at, True)
    assert ran == [1] * 5  # the verification chunk: five one-position forwards
    assert rw.back(cache, at + 5, at + 3) == at
    assert rw.settle(cache, at, forward) == at + 3
    assert ran == [1] * 8  # and the replay: three more
    for t in CHUNK[:3]:
        model.forward(mx.array([[t]]), direct)
    mx.eval([c.state for c in cache], [c.state for c in direct])
    for a, b in zip(cache, direct):  # a full-attention layer's buffer past its offset is never read
        assert (a.offset, type(a)) == (b.offset, type(b))
        live = slice(None) if isinstance(a, RotatingKVCache) else slice(0, a.offset)
        for x, y in ((a.keys, b.keys), (a.values, b.values)):
            np.testing.assert_array_equal(np.array(x[..., live, :]), np.array(y[..., live, :]))
