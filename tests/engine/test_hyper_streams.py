"""DeepSeek-V4.1 through a split: its residual streams, their pre-mix and the state its layers share
(compressed K/V, index keys, top-k picks, candidate blocks) cross each boundary as mlx-lm's own
pipeline lays them out (engine/stage/hyper_streams.py); the pure copy of those rules that the
agent and the planner use (families/hyper_layout.py) agrees with mlx-lm's; and the comparison with
single-process mlx-lm fails when any one part does not arrive."""

from __future__ import annotations

import json
import random

import mlx.core as mx
import pytest
from mlx_lm.models import deepseek_v41 as family

from orchestrator.engine import wire
from orchestrator.engine.stage import hyper_streams, stand_ins
from orchestrator.engine.stage.carry import Carry
from orchestrator.engine.stage.shard import StageModel
from orchestrator.engine.tensors import to_frame
from orchestrator.families import hyper_layout
from orchestrator.families.decoder_config import decoder_view
from orchestrator.models.boundaries import hyper_wire_bytes_per_token
from orchestrator.models.describe import describe_model
from orchestrator.planner import PlanSettings
from orchestrator.planner.memory import StageCosts
from tests.support.engine_harness import assert_same, reference, split_in_process

PROMPT = [(i * 37 + 11) % 500 for i in range(40)]
TOKENS = 16


def _run(model, bounds):
    return split_in_process([StageModel(model, a, b) for a, b in bounds], PROMPT, TOKENS, prefill_step=16)


def _view(model) -> dict:
    return decoder_view(json.loads((model / "config.json").read_text()))


# Layers 1 and 3 compress (1 also indexes), 2 and 4 index, 2 picks candidate blocks for 4; 5 reuses 4's picks.
CROSSING = {1: set(), 2: {"compress_kv", "index_k"}, 3: {"index_k", "candidates", "topk_idx"},
            4: {"compress_kv", "index_k", "candidates"}, 5: {"compress_kv", "topk_idx"}}


@pytest.mark.parametrize("boundary", sorted(CROSSING))
def test_every_boundary_carries_what_the_layers_after_it_read(family_model, boundary):
    model = family_model("deepseek_v41")
    cfg = json.loads((model / "config.json").read_text())
    assert "text_config" in cfg  # the published layout
    stage = StageModel(model, boundary, 6)
    assert stage.hidden_shape == (4, 64)
    expected = stage.expects(40)(1)
    assert set(expected) == {"pre_mix", *CROSSING[boundary]}
    assert expected["pre_mix"] == ((1, 4), mx.float32)
    assert set(hyper_layout.crossing(_view(model), boundary)) == CROSSING[boundary]


def test_splits_at_every_boundary_and_through_six_stages_equal_mlx_lm(family_model):
    model = family_model("deepseek_v41")
    expected = reference(model, PROMPT, TOKENS, prefill_step=16)
    assert_same(expected, _run(model, [(0, 4), (4, 6)]))
    assert_same(expected, _run(model, [(i, i + 1) for i in range(6)]))


def _zeroed(key):
    send = hyper_streams.HyperStreams.send

    def broken(self, *args):
        out = send(self, *args)
        if key in out:
            out[key] = mx.ones_like(out[key]) if key == "candidates" else mx.zeros_like(out[key])
        return out
    return broken


@pytest.mark.parametrize("key,boundary", [("compress_kv", 2), ("index_k", 3), ("topk_idx", 5), ("candidates", 4)])
def test_the_comparison_detects_a_shared_part_not_crossing(family_model, monkeypatch, key, boundary):
    model = family_model("deepseek_v41")
    expected = reference(model, PROMPT, TOKENS, prefill_step=16)
    monkeypatch.setattr(hyper_streams.HyperStreams, "send", _zeroed(key))
    with pytest.raises(AssertionError):
        assert_same(expected, _run(model, [(0, boundary), (boundary, 6)]))


def test_the_comparison_detects_the_pre_mix_not_crossing(family_model, monkeypatch):
    """The next stage collapsing the streams with the first layer's one-hot mix, not the one received."""
    model = family_model("deepseek_v41")
    expected = reference(model, PROMPT, TOKENS, prefill_step=16)
    feed = stand_ins.Entry.feed
    monkeypatch.setattr(stand_ins.Entry, "feed", lambda self, h, handed=None, before=None: feed(self, h, None, before))
    with pytest.raises(AssertionError):
        assert_same(expected, _run(model, [(0, 1), (1, 6)]))


def test_the_comparison_detects_skipped_layers_not_keeping_the_window_in_step(family_model, monkeypatch):
    """A skipped layer's LayerCache counting the offset only (no window rows): the next stage's window
    indices, read off layer 0's cache, would be wrong."""
    model = family_model("deepseek_v41")
    expected = reference(model, PROMPT, TOKENS, prefill_step=16)
    advance = stand_ins._advance

    def offset_only(cache, length, batch):
        if hasattr(cache, "update_window"):
            cache.offset += length
        else:
            advance(cache, length, batch)
    monkeypatch.setattr(stand_ins, "_advance", offset_only)
    with pytest.raises(AssertionError):
        assert_same(expected, _run(model, [(0, 3), (3, 6)]))


def _random_view(rng: random.Random) -> dict:
    n = rng.randint(3, 12)
    ratios = [rng.choice([0, 1, 4, 4, 128]) for _ in range(n)]
    compressed = [i for i in range(n) if ratios[i]] or [0]
    ratios[compressed[0]] = ratios[compressed[0]] or 4
    # sources and indexers among the compressed layers (a window-only layer neither compresses nor indexes)
    kv = sorted(rng.sample(compressed, rng.randint(1, len(compressed))))
    index = sorted(rng.sample(compressed, rng.randint(0, len(compressed))))
    return {"num_hidden_layers": n, "compress_ratios": ratios, "kv_source_layer_ids": kv,
            "index_source_layer_ids": index, "candidate_source_layer_id": rng.choice([-1, *range(n)]),
            "candidate_topk_blocks": rng.choice([0, 2, 2048]), "candidate_block_size": rng.choice([2, 8]),
            "index_topk": rng.choice([4, 512]), "head_dim": 32, "index_head_dim": 16, "hc_mult": 4}


def test_the_pure_layout_is_mlx_lms_own_on_many_layouts():
    """hyper_layout's crossing and per-token wire parts against mlx-lm's _crossing and _layout, for
    200 random layer layouts (ratios, source and indexer layers, candidate source), every boundary,
    decode steps at several positions."""
    rng = random.Random(7)
    for _ in range(200):
        view = _random_view(rng)
        args = family.ModelArgs.from_dict({**view, "hidden_size": 64})
        for b in range(1, view["num_hidden_layers"]):
            crossing = family._crossing(args, b)
            assert hyper_layout.crossing(view, b) == crossing, (view, b)
            for position in (0, 3, 40, 4095):
                layout = {k: (s, d) for k, s, d in family._layout(args, crossing, 1, 1, position, mx.bfloat16)}
                parts = hyper_layout.wire_parts(view, b, position, 64, 2)
                assert set(parts) == {"h" if k == "streams" else k for k in layout}
                for key, (shape, dtype) in layout.items():
                    if key in ("compress_kv", "index_k"):
                        continue  # one entry per `ratio` tokens: counted per token (below)
                    rank, size = parts["h" if key == "streams" else key]
                    assert (rank, size) == (len(shape), shape[1] * shape[-1] * (shape[2] if rank == 4 else 1)
                                            * dtype.size), (view, b, position, key)


def _frame_bytes(stage: StageModel, cache, position: int, token: int) -> int:
    out = stage.forward(mx.array([[token]]), cache)
    assert isinstance(out, Carry)
    mx.eval(out.h, out.extras)
    return len(wire.encode(to_frame(1, position, out.h, extras=out.extras)))


@pytest.mark.parametrize("boundary", [2, 3, 4, 5])
def test_the_planned_wire_bytes_are_the_frames_a_stage_sends(family_model, boundary):
    """Eight decode steps from position 40 (two groups of four tokens close): the frames the first
    stage sends add up to the agent's figure per token (describe's wire parts at each position)."""
    model = family_model("deepseek_v41")
    view = _view(model)
    stage = StageModel(model, 0, boundary)
    cache = stage.make_cache()
    mx.eval(stage.forward(mx.array([PROMPT]), cache).h)
    measured = sum(_frame_bytes(stage, cache, 40 + i, PROMPT[i]) for i in range(8))
    planned = sum(hyper_wire_bytes_per_token(view, boundary, 40 + i, 64, 4) for i in range(8))
    assert measured == planned + 8 * wire.HEADER_SIZE


@pytest.mark.parametrize("split", [((0, 1), (2, 5)), ((0, 2), (3, 5)), ((0, 3), (4, 5))])
def test_the_planned_kv_cache_is_within_15_percent_of_what_each_stage_holds(family_model, split):
    """At 300 tokens, per stage: windows, compressed entries and index keys of its own layers, and the
    entries it received and appended to its first layer's cache (the stage after boundary 2, 3, 4)."""
    model = family_model("deepseek_v41")
    stages = [StageModel(model, a, b + 1) for a, b in split]
    caches = [s.make_cache() for s in stages]
    for tokens in ([5 + i % 500 for i in range(299)], [7]):
        x = mx.array([tokens])
        for stage, cache in zip(stages, caches):
            x = stage.forward(x, cache)
            mx.eval(x)
    measured = [sum(c.nbytes for c in cache) for cache in caches]
    costs = StageCosts(describe_model(model), PlanSettings(context_length=300, max_concurrent_sequences=1))
    planned = [costs.kv_bytes(a, b + 1) for a, b in split]
    assert caches[1][split[1][0]].compress_kv is not None or caches[1][split[1][0]].index_k is not None
    assert all(abs(p - m) / m <= 0.15 for p, m in zip(planned, measured)), (planned, measured)


def _prefilled(stage: StageModel, length: int) -> list:
    cache = stage.make_cache()
    mx.eval(stage.forward(mx.array([PROMPT[:length]]), cache).h, [c.state for c in cache])
    return cache


def _valid_picks(picks: mx.array) -> list[list[int]]:
    """Each row's picks as a sorted list (-1 is none): which entries it attends to, not in which order."""
    return [sorted(p for p in row if p >= 0) for row in picks.reshape(-1, picks.shape[-1]).tolist()]


def _close(a: mx.array, b: mx.array) -> bool:
    """Equal up to the low bits of a longer or shorter chunk (which the fake fp4/fp8 quantization can
    round a step apart): relatively, in norm; entries of other positions or groups are nowhere near."""
    return a.size == 0 or (mx.linalg.norm((a - b).reshape(-1)) <= 1e-3 * mx.linalg.norm(b.reshape(-1))).item()


def _assert_same_parts(got: Carry, want: Carry) -> None:
    assert got.h.shape == want.h.shape and set(got.extras) == set(want.extras)
    assert _close(got.h, want.h)
    for key, part in want.extras.items():
        assert got.extras[key].shape == part.shape, key
        if part.dtype == mx.int32:
            assert _valid_picks(got.extras[key]) == _valid_picks(part), key
        elif part.dtype == mx.bool_:
            assert mx.array_equal(got.extras[key], part).item(), key
        else:
            assert _close(got.extras[key], part), key


@pytest.mark.parametrize("boundary", [2, 3, 4])
def test_a_replay_cuts_and_joins_what_crosses_as_forwards_of_those_positions_send_it(family_model, boundary):
    """A rollback's replay (engine/stage/rewind.py) cuts what a verification chunk of five positions sent
    at positions [0, a) and [a, 5), and joins such parts: each is what a forward of just those positions
    sends (per token the same; compressed entries and index keys of the groups those tokens complete;
    the same picks and candidate flags, at the width of the part's end), from positions where the picks'
    width still grows (5, 6) and where groups close inside the chunk (13)."""
    model = family_model("deepseek_v41")
    stage = StageModel(model, 0, boundary)
    cut = stage.by_position[1]
    for at in (5, 6, 13):
        chunk = mx.array([PROMPT[at:at + 5]])
        whole = stage.forward(chunk, _prefilled(stage, at))
        for a in range(1, 5):
            cache = _prefilled(stage, at)
            first = stage.forward(chunk[:, :a], cache)
            rest = stage.forward(chunk[:, a:], cache)
            _assert_same_parts(cut.positions(whole, at, 0, a), first)
            _assert_same_parts(cut.positions(whole, at, a), rest)
            _assert_same_parts(cut.join([first, rest], at), whole)


def test_a_cut_keeps_every_pick_of_a_row_whatever_its_place():
    """mlx's argpartition leaves a row's picks in no promised order: cutting the picks to a narrower
    width moves them to the front first (in order); candidate flags past a row's blocks are False."""
    picks = mx.array([[[-1, 3, -1, 1], [2, -1, -1, -1]]], dtype=mx.int32)
    assert hyper_streams._fit(picks, 2).tolist() == [[[3, 1], [2, -1]]]
    assert hyper_streams._fit(picks, 5).tolist() == [[[-1, 3, -1, 1, -1], [2, -1, -1, -1, -1]]]
    flags = mx.array([[[True, False, False]]])
    assert hyper_streams._fit(flags, 1).tolist() == [[[True]]]
    assert hyper_streams._fit(flags, 4).tolist() == [[[True, False, False, False]]]
