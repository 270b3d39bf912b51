"""The replay of prompt-lookup drafting (e2e/bench/lookup_replay.py): the passes a cluster would run."""

from __future__ import annotations

from e2e.bench.lookup_replay import replay

COST = {0: 1.0, 1: 1.1, 2: 1.2, 3: 1.3, 4: 1.5}


def test_a_two_token_match_drafts_what_followed_it_and_the_answer_decides_what_is_right():
    # "1 2" occurred at the prompt's start, followed by 3 4: drafted and right; 9 is the pass's own token
    assert replay([1, 2, 3, 4, 5], [1, 2, 3, 4, 9], COST, 4, min_ngram=2) == (1, 2, 2, 1.0 + 1.0 + 1.2)


def test_a_one_token_match_drafts_sooner():
    # the answer's first token "1" occurred before: the next step drafts 2 3 4 (room: 3 before the end)
    assert replay([1, 2, 3, 4, 5], [1, 2, 3, 4, 9], COST, 4, min_ngram=1) == (1, 3, 3, 1.0 + 1.3)


def test_a_wrong_draft_costs_a_pass_and_yields_one_token():
    # the prompt ends with "7 8", which occurred at its start followed by 1 7: drafted, and wrong
    passes, drafted, accepted, spent = replay([7, 8, 1, 7, 8], [3, 3, 3], COST, 4, min_ngram=2)
    assert (passes, drafted, accepted) == (1, 2, 0) and spent == 1.2 + 1.0 + 1.0
