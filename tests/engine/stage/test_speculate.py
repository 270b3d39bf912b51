"""The stage's speculation helpers on their own: drafts checked (engine/stage/speculate.py)."""

from __future__ import annotations

import pytest

from orchestrator.engine.stage.speculate import MAX_DRAFT, parse_draft


@pytest.mark.parametrize("payload", [{}, {"tokens": []}, {"tokens": [1] * (MAX_DRAFT + 1)}, {"tokens": [1, -1]},
                                     {"tokens": [1, 500]}, {"tokens": [True]}, {"tokens": "12"}, [1, 2]])
def test_a_bad_draft_is_refused(payload):
    with pytest.raises(ValueError):
        parse_draft(payload, vocab=500)


def test_a_draft():
    assert parse_draft({"tokens": [0, 499, 7]}, vocab=500) == [0, 499, 7]
