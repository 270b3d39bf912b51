"""Prompt-lookup drafting and the adaptive draft length (pure; engine/coordinator/drafting.py)."""

from __future__ import annotations

import pytest

from orchestrator.engine.coordinator.drafting import MAX_RETRY_AFTER, RETRY_AFTER, DraftLength, Lookup


def test_the_tokens_that_followed_the_latest_earlier_occurrence():
    lookup = Lookup(tokens=[1, 2, 3, 4, 5, 9, 2, 3, 4, 6, 7])
    lookup.extend([2, 3])
    # "2 3" last occurred at 6..7 (followed by 4 6 7 2); the longest n-gram wins: "3" alone would say the same
    assert lookup.draft(4) == [4, 6, 7, 2]
    lookup.extend([4])  # "2 3 4": latest earlier occurrence is at 6..8, followed by 6 7
    assert lookup.draft(3) == [6, 7, 2]


def test_longest_ngram_first_then_shorter():
    lookup = Lookup(max_ngram=3, min_ngram=1, tokens=[7, 8, 9, 1, 5, 8, 9, 2, 8, 9])
    assert lookup.draft(2) == [2, 8]  # "8 9" latest earlier occurrence at 5..6, followed by 2
    lookup.extend([3])
    assert lookup.draft(2) == []  # 3 never occurred before
    lookup.extend([8])
    assert lookup.draft(2) == [9, 3]  # "3 8" unknown; "8" latest earlier at 8, followed by 9 3


def test_nothing_to_draft():
    assert Lookup(tokens=[]).draft(4) == []
    assert Lookup(tokens=[1, 2, 3]).draft(4) == []
    assert Lookup(tokens=[1, 2, 1]).draft(0) == []
    with pytest.raises(ValueError):
        Lookup(max_ngram=0)
    with pytest.raises(ValueError):
        Lookup(max_ngram=2, min_ngram=3)


def test_a_lone_token_seen_before_drafts_nothing_by_default():
    lookup = Lookup(tokens=[5, 8, 9, 2, 7, 8])
    assert lookup.draft(3) == []  # only "8" occurred before: too little to go on
    assert Lookup(tokens=[5, 8, 9, 2, 7, 8], min_ngram=1).draft(3) == [9, 2, 7]
    lookup.extend([9])  # "8 9" occurred before
    assert lookup.draft(3) == [2, 7, 8]


def test_draft_never_includes_the_current_position():
    lookup = Lookup(tokens=[4, 4, 4], min_ngram=1)
    assert lookup.draft(5) == [4]  # "4 4" at 1..2 has no follower: the occurrence at 0..1, followed by 4


def test_adaptive_length_grows_shrinks_and_retries():
    length = DraftLength(4)
    assert length.next() == 4
    length.observe(4, 4)
    assert length.k == 4  # capped at the maximum
    length.observe(4, 1)
    assert length.k == 2
    length.observe(2, 0)
    assert length.k == 1
    length.observe(1, 0)
    assert length.k == 0
    assert [length.next() for _ in range(RETRY_AFTER - 1)] == [0] * (RETRY_AFTER - 1)
    assert length.next() == 1  # tries one token again
    length.observe(1, 1)
    assert length.k == 2


def _plain_steps_before_a_retry(length: DraftLength) -> int:
    steps = 0
    while length.next() == 0:
        steps += 1
    return steps


def test_each_retry_that_accepts_nothing_doubles_the_wait_and_an_accepted_draft_resets_it():
    length = DraftLength(4)
    length.observe(4, 0), length.observe(2, 0), length.observe(1, 0)
    assert length.k == 0
    waits = []
    for _ in range(6):
        waits.append(_plain_steps_before_a_retry(length) + 1)  # the retry's own step ends the count
        length.observe(1, 0)
    assert waits == [RETRY_AFTER, 2 * RETRY_AFTER, 4 * RETRY_AFTER, 8 * RETRY_AFTER, MAX_RETRY_AFTER,
                     MAX_RETRY_AFTER]
    assert _plain_steps_before_a_retry(length) + 1 == MAX_RETRY_AFTER
    length.observe(1, 1)  # text that repeats again: drafting resumes, and the wait is short once more
    assert length.k == 2
    length.observe(2, 0), length.observe(1, 0)
    assert _plain_steps_before_a_retry(length) + 1 == RETRY_AFTER


def test_off_stays_off():
    length = DraftLength(0)
    assert [length.next() for _ in range(RETRY_AFTER * 2)] == [0] * (RETRY_AFTER * 2)
    with pytest.raises(ValueError):
        DraftLength(-1)
