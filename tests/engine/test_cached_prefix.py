"""The exactness matrix's cached-prefix rows: a prompt-cache hit equals mlx-lm, for every family.

For each family a split (two stages) and the whole model in one process (mlx-lm's own
prompt-cache path, `cache_rig.whole`) serve the same two turns through the same index; the
second turn starts from the first's cache entry. Bits must equal the whole model's (same
chunks, same caches, same trims), tokens must equal a cold `generate_step` run. The hits:
a strict prefix of a cached sequence (trimmed), the conversation's next turn (the whole
entry), a hit inside a sliding window (trimmed while the window is not yet full), and a
checkpoint in the middle of the prefill (the only reuse a recurrent state allows besides
the next turn). Then the comparison is shown to bite: a stage that reuses a stale entry,
or skips trimming, fails it.
"""

from __future__ import annotations

import pytest
from mlx_lm.models.cache import can_trim_prompt_cache

from orchestrator.engine.stage.faults import Faults
from orchestrator.testmodels.families import FAMILIES
from tests.support import matrix
from tests.support.cache_rig import CachedRig, whole
from tests.support.engine_harness import assert_same, reference, two_stages

PROMPT = [(i * 37 + 11) % 500 for i in range(40)]
CHUNK = 16
TOKENS = 6
NAMES = sorted(FAMILIES)


def _turns(stages, turns: list[tuple[list[int], tuple[int, ...]]], faults=None):
    rig = CachedRig(stages, CHUNK, faults=faults)
    out = [rig.run(prompt, TOKENS, checkpoints) for prompt, checkpoints in turns]
    return out, rig


def _scenarios() -> dict[str, tuple[list[tuple[list[int], tuple[int, ...]]], int | None]]:
    """name -> (turns, the second turn's expected reuse when every cache can trim; None: the
    first turn's covered tokens, i.e. the whole entry)."""
    return {
        "strict-prefix": ([(PROMPT, ()), (PROMPT[:30] + [7, 8, 9, 10, 11], ())], 30),
        "next-turn": ([(PROMPT, ()), (None, ())], None),  # second prompt: turn one's tokens + a new turn
        "inside-window": ([(PROMPT[:2], ()), (None, ())], 5),  # second prompt: 5 of turn one's 7 tokens + more
        "checkpoint": ([(PROMPT, (24,)), (PROMPT[:24] + [5, 6, 7, 8], ())], 24),
    }


# mlx-lm's own prompt-cache path (what the split equals bit for bit) is not token-exact against a cold
# run for plamo3 past its sliding window: the next turn's and a checkpoint's greedy tokens differ there.
# Why: mlx-lm's plamo3 masks its sliding layers with `window_size + 1` but gives them a
# `RotatingKVCache(max_size=window_size)`, so a query inside a prefill chunk sees one key more than a
# decode step or a chunk's first queries after the window filled. How far a position attends thus
# depends on where the chunks were cut (a generated token of turn one was a decode step; in the cold
# run it is prefilled; a checkpoint cuts a chunk), not on the position alone.
# `test_plamo3_is_exact_when_its_mask_spans_its_cache` shows that this is the whole difference.
KNOWN_INEXACT = {("plamo3", "next-turn"), ("plamo3", "checkpoint")}


# Every scenario on these: plain attention, a sliding window, chunked attention, a hybrid recurrent
# stack, MoE, and the known-inexact plamo3 (its off-list check must keep running).
EVERY_SCENARIO = ("llama", "gemma3_text", "llama4_text", "qwen3_next", "qwen3_moe", "plamo3")


@pytest.mark.parametrize("family,scenario", matrix.rows(NAMES, list(_scenarios()), every=EVERY_SCENARIO))
def test_cached_prefix_equals_mlx_lm(family_model, family, scenario):
    trace, cold = _cached_and_cold(family_model, family, scenario)
    if (family, scenario) in KNOWN_INEXACT:
        assert trace.tokens != cold.tokens, "plamo3's cached path became token-exact: take it off KNOWN_INEXACT"
    else:
        assert trace.tokens == cold.tokens, "a cache hit changed the greedy tokens of a cold run"


@pytest.mark.parametrize("scenario", sorted(s for f, s in KNOWN_INEXACT if f == "plamo3"))
def test_plamo3_is_exact_when_its_mask_spans_its_cache(family_model, scenario, monkeypatch):
    """With plamo3's sliding mask as wide as its rotating cache (`window_size`, not `+ 1`), its
    KNOWN_INEXACT rows are token-exact: that off-by-one in mlx-lm's plamo3 is the whole difference."""
    import mlx_lm.models.plamo3 as plamo3

    mask = plamo3.create_attention_mask

    def as_wide_as_the_cache(h, cache=None, window_size=None, **kw):
        return mask(h, cache, **kw) if window_size is None else mask(h, cache, window_size=window_size - 1, **kw)

    monkeypatch.setattr(plamo3, "create_attention_mask", as_wide_as_the_cache)
    trace, cold = _cached_and_cold(family_model, "plamo3", scenario)
    assert trace.tokens == cold.tokens


def _cached_and_cold(family_model, family: str, scenario: str):
    """Run a scenario's two turns split and whole; assert the split equals mlx-lm's cached path bit
    for bit and hit as planned; return the second turn's trace and a cold run of its prompt."""
    model = family_model(family)
    turns, keep = _scenarios()[scenario]
    if turns[1][0] is None:  # built from what turn one generated
        first = reference(model, turns[0][0], TOKENS, prefill_step=CHUNK)
        covered = turns[0][0] + first.tokens[:-1]
        if keep is None:  # the next turn of the conversation: everything turn one covered, and more
            keep = len(covered)
        turns = [turns[0], (covered[:keep] + [3, 1, 4, 1, 5], ())]
    expected, _ = _turns(whole(model), turns)
    got, rig = _turns(two_stages(model), turns)
    (ref_trace, ref_reuse), (trace, reuse) = expected[1], got[1]
    assert reuse == ref_reuse, "the index planned differently for the split and the whole model"
    first_entry = len(turns[0][0]) + TOKENS - 1
    if scenario in ("next-turn", "checkpoint") or first_entry < _trim_limit(rig.stages[0].make_cache()):
        assert reuse is not None and reuse.keep == keep, f"expected a hit of {keep} tokens, got {reuse}"
    assert_same(ref_trace, trace)  # bit for bit mlx-lm's own prompt-cache path
    assert_same(expected[0][0], got[0][0])  # the turn that stored the entry (or the checkpoint) too
    return trace, reference(model, turns[1][0], TOKENS, prefill_step=CHUNK)


def _trim_limit(cache: list) -> float:
    """Entries shorter than this can be trimmed to any length: 0 with a recurrent state or chunked
    attention (no further than its chunk's start), a sliding window's size."""
    flat = [c for top in cache for c in getattr(top, "caches", (top,))]
    if not can_trim_prompt_cache(cache) or any(hasattr(c, "chunk_size") for c in flat):
        return 0
    return min((c.max_size for c in flat if hasattr(c, "max_size")), default=float("inf"))


@pytest.mark.parametrize("fault", ["cache-skip-trim", "cache-stale"])
def test_the_comparison_detects_a_stale_or_untrimmed_entry(family_model, fault):
    """Llama (trimmable): turn three reuses 30 tokens of turn two's entry. A stage that keeps the
    entry's later tokens, or serves the first (unrelated) entry instead, fails the comparison."""
    model = family_model("llama")
    other = [(i * 11 + 3) % 500 for i in range(40)]
    turns = [(other, ()), (PROMPT, ()), (PROMPT[:30] + [7, 8, 9, 10, 11], ())]
    expected, _ = _turns(whole(model), turns)
    broken = [Faults(), Faults({fault: 1})]
    got, _ = _turns(two_stages(model), turns, faults=broken)
    assert got[2][1] is not None and got[2][1].keep == 30
    with pytest.raises(AssertionError):
        assert_same(expected[2][0], got[2][0])
    fine, _ = _turns(two_stages(model), turns)
    assert_same(expected[2][0], fine[2][0])  # the same runner, unbroken, passes
