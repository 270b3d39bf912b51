"""The LAN benchmark's random pairs (random_pairs.py, pure): seeded draws within their ranges,
and the share of predictions within ±20 %. Needs no root (no LAN is built)."""

from __future__ import annotations

import math

import pytest

from e2e.lan.random_pairs import HIDDEN, LAYERS, RATES, RTT_MS, draw, share_within, within


def test_the_same_seed_draws_the_same_pairs_and_another_seed_others():
    assert draw(6, 23) == draw(6, 23)
    assert draw(6, 23) != draw(6, 24)
    assert draw(3, 23) == draw(6, 23)[:3]  # a smaller N is a prefix: runs of one seed compare


def test_every_draw_is_within_its_ranges_and_splits_in_two():
    pairs = draw(200, 1)
    for p in pairs:
        assert LAYERS[0] <= p.layers <= LAYERS[1] and p.layers % 2 == 0
        assert p.hidden in HIDDEN and p.heads * 64 == p.hidden and p.heads % p.kv_heads == 0
        assert p.link.rtt_ms == 0 or RTT_MS[0] <= p.link.rtt_ms <= RTT_MS[1]
        assert p.link.rate_bps in RATES and p.link.jitter_ms == 0 and p.link.loss == 0
        (a, b), (c, d) = p.split
        assert (a, d, c) == (0, p.layers - 1, b + 1) and b - a == d - c
    # both plain and relayed links, capped and uncapped, are drawn
    assert {p.link.relayed for p in pairs} == {True, False}
    assert {p.link.rate_bps is None for p in pairs} == {True, False}


def test_a_bad_count_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        draw(0, 1)


@pytest.mark.parametrize("measured, predicted, verdict", [
    (10.0, 12.0, True), (10.0, 8.0, True), (10.0, 12.01, False), (10.0, 7.9, False),
    (None, 5.0, None), (math.nan, 5.0, None), (0.0, 5.0, None),
])
def test_within_twenty_percent(measured, predicted, verdict):
    assert within(measured, predicted) is verdict


def test_the_share_counts_only_what_was_measured():
    assert share_within([(10, 11), (10, 15), (None, 3), (math.nan, 1), (20, 19)]) == (2, 3)
