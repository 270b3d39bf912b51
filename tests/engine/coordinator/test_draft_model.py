"""The coordinator's draft model (engine/coordinator/draft_model.py), in process: its drafts are the
draft model's own greedy continuation (mlx-lm's generate_step), also after a verification kept only
part of the last draft (the cache cut back with mlx-lm's trim); another tokenizer or caches that
cannot roll back are refused at load."""

from __future__ import annotations

import pytest

from orchestrator.engine.coordinator.draft_model import DraftModel, DraftModelError, check_same_tokenizer
from orchestrator.testmodels.families import build_family_model
from tests.support.engine_harness import reference
from tests.support.tokenizers import with_swapped_tokens

PROMPT = [(i * 37 + 11) % 500 for i in range(40)]


def test_a_draft_is_the_draft_models_greedy_continuation(model_factory):
    target, small = model_factory(layers=4), model_factory(layers=2, seed=3)
    drafter = DraftModel(small, target)
    assert drafter.draft(1, PROMPT, 5) == reference(small, PROMPT, 5).tokens


def test_after_a_partial_acceptance_the_next_draft_is_what_a_fresh_cache_gives(model_factory):
    """The sequence moves on with two of five drafted tokens and a token of the target's: the kept
    cache is cut back to the shared prefix, and the draft equals a new drafter's on the new sequence."""
    target, small = model_factory(layers=4), model_factory(layers=2, seed=3)
    drafter = DraftModel(small, target)
    first = drafter.draft(7, PROMPT, 5)
    sequence = [*PROMPT, *first[:2], (first[2] + 1) % 500]
    again = drafter.draft(7, sequence, 4)
    assert again == DraftModel(small, target).draft(7, sequence, 4) == reference(small, sequence, 4).tokens
    assert drafter._requests[7].seen == [*sequence, *again[:-1]]  # what its cache holds now
    # every drafted token accepted, plus one: the cache only catches up
    longer = [*sequence, *again, 9]
    assert drafter.draft(7, longer, 3) == reference(small, longer, 3).tokens


def test_a_long_prompt_is_caught_up_over_several_calls_before_the_first_draft(model_factory):
    target, small = model_factory(layers=4), model_factory(layers=2, seed=3)
    drafter = DraftModel(small, target)
    prompt = [(i * 7 + 3) % 500 for i in range(150)]
    assert drafter.draft(1, prompt, 3) == [] and drafter.draft(1, prompt, 3) == []  # 64 + 64 of 150 tokens
    assert len(drafter._requests[1].seen) == 128
    assert drafter.draft(1, prompt, 3) == reference(small, prompt, 3).tokens


def test_requests_draft_independently_and_a_finished_one_is_forgotten(model_factory):
    target, small = model_factory(layers=4), model_factory(layers=2, seed=3)
    drafter = DraftModel(small, target, max_requests=2)
    a, b = drafter.draft(1, PROMPT, 3), drafter.draft(2, PROMPT[:20], 3)
    assert a == reference(small, PROMPT, 3).tokens and b == reference(small, PROMPT[:20], 3).tokens
    drafter.draft(3, PROMPT[:10], 1)  # a third request: the least recent (1) goes
    assert set(drafter._requests) == {2, 3}
    drafter.forget(2)
    assert set(drafter._requests) == {3}


def test_another_tokenizer_is_refused(model_factory, tmp_path):
    target = model_factory(layers=4)
    other = with_swapped_tokens(model_factory(layers=2, seed=3), tmp_path / "other")
    with pytest.raises(DraftModelError, match="another tokenizer"):
        check_same_tokenizer(target, other)
    with pytest.raises(DraftModelError, match="another tokenizer"):
        DraftModel(other, target)


def test_a_draft_model_whose_caches_cannot_roll_back_is_refused(model_factory, tmp_path):
    windowed = build_family_model(tmp_path / "gemma3_text", "gemma3_text")  # the same test tokenizer
    with pytest.raises(DraftModelError, match="cannot roll back"):
        DraftModel(windowed, model_factory(layers=4))
