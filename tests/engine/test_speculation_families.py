"""The exactness matrix's speculation rows: greedy with verification passes equals greedy mlx-lm, per family.

For every family a two-stage split runs the stages' own speculation code in process (speculate.verify on the
last stage with a greedy `Sampler`, speculate.rollback on every stage) with drafts from an oracle that knows
the reference answer and spoils one token of most passes, so passes accept all, some or none of their drafts.
The tokens must equal a cold `generate_step` run. Families whose caches cannot roll back exactly (a recurrent
state, a sliding window, chunked attention) must report so (`can_speculate`): the coordinator never drafts
for them. Then the comparison is shown to bite: a stage that skips the trim fails it.
"""

from __future__ import annotations

import mlx.core as mx
import pytest

from orchestrator.engine.stage.sampling import Sampler
from orchestrator.engine.stage.shard import StageModel
from orchestrator.engine.stage.speculate import can_speculate, rollback, verify
from orchestrator.testmodels.families import FAMILIES
from tests.engine.harness import reference, two_stages

PROMPT = [(i * 37 + 11) % 500 for i in range(40)]
CHUNK = 16
TOKENS = 14
DRAFT = 4
NAMES = sorted(FAMILIES)


def speculate(stages: list[StageModel], prompt: list[int], answer: list[int], skip_trim: bool = False) -> list[int]:
    """Greedy generation of len(answer) tokens through `stages`, verifying oracle drafts each pass."""
    caches = [s.make_cache() for s in stages]
    sampler = Sampler()

    def through(tokens: list[int]) -> mx.array:
        x = mx.array(tokens)[None]
        for s, c in zip(stages, caches):
            x = s.forward(x, c)
        return x

    for start in range(0, len(prompt) - 1, CHUNK):
        through(prompt[start:min(start + CHUNK, len(prompt) - 1)])
        mx.eval([c.state for cache in caches for c in cache])
    out, position, token = [], len(prompt) - 1, prompt[-1]
    while len(out) < len(answer):
        draft = list(answer[len(out):len(out) + min(DRAFT, len(answer) - len(out) - 1)])
        wrong = len(out) % (DRAFT + 2)
        if wrong < len(draft):
            draft[wrong] = (draft[wrong] + 1) % 500
        emitted = [t for t, _ in verify(sampler, through([token, *draft]), draft)]
        end = position + len(draft) + 1
        for cache in caches:  # every stage rolls back to what the pass accepted
            if position + len(emitted) < end:
                rollback(cache, end, position + len(emitted), position + 1, skip_trim=skip_trim)
        out += emitted
        position, token = position + len(emitted), out[-1]
    return out[:len(answer)]


@pytest.mark.parametrize("family", NAMES)
def test_speculation_equals_mlx_lm(family_model, family):
    model = family_model(family)
    stages = two_stages(model)
    if not can_speculate(stages[0].make_cache()):
        pytest.skip(f"{family}: its caches cannot roll back exactly, the coordinator never drafts for it")
    want = reference(model, PROMPT, TOKENS, prefill_step=CHUNK).tokens
    assert speculate(stages, PROMPT, want) == want


def test_which_families_speculate(family_model):
    """The families whose caches roll back exactly, as the stages report them (docs/speculation.md)."""
    off = sorted(f for f in NAMES if not can_speculate(StageModel(family_model(f), 0, 1).make_cache()))
    assert "llama" not in off and "qwen3" not in off
    for family in ("falcon_h1", "jamba", "qwen3_next", "gemma3_text", "mistral"):  # SSM, hybrid, windows
        if family in FAMILIES:
            assert family in off, f"{family} must not speculate"


def test_the_comparison_detects_a_stage_that_skips_the_trim(family_model):
    model = family_model("llama")
    want = reference(model, PROMPT, TOKENS, prefill_step=CHUNK).tokens
    assert speculate(two_stages(model), PROMPT, want) == want
    assert speculate(two_stages(model), PROMPT, want, skip_trim=True) != want
