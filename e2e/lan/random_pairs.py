"""Random (model shape, link profile) pairs for the LAN benchmark's `--random N --seed S` (pure).

The fixed profiles (profiles.py) and SmolLM2 are what the prediction was tuned on; a pair
drawn here is a model and a link it never saw: layers, hidden size, the round trip a relay
adds and a line-rate cap, from a seeded generator so a run can be repeated. The sizes stay
within what a small shared CPU machine runs in a minute or two per pair (a 1k-token prompt
through every layer included). `share_within` is the figure the benchmark reports: how many
predicted numbers fall within ±20 % of the measured ones.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from dataclasses import dataclass

from e2e.lan.profiles import LinkProfile

LAYERS = (4, 16)  # inclusive, even (split in two equal stages)
HIDDEN = (128, 192, 256)  # multiples of 64 (heads of 64)
RTT_MS = (0.0, 12.0)  # uniform; a quarter of the draws are plain (no relay)
RATES = (None, None, 100e6, 300e6, 1e9)  # None: uncapped
TOLERANCE = 0.20


@dataclass(frozen=True)
class Pair:
    """One drawn model shape and link profile."""

    index: int
    layers: int
    hidden: int
    link: LinkProfile

    @property
    def heads(self) -> int:
        return self.hidden // 64

    @property
    def kv_heads(self) -> int:
        return max(1, self.heads // 2)

    @property
    def split(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """Stage 0 takes the first half of the layers, stage 1 the rest."""
        half = self.layers // 2
        return (0, half - 1), (half, self.layers - 1)

    @property
    def label(self) -> str:
        return f"{self.layers} layers × {self.hidden}"


def draw(n: int, seed: int) -> list[Pair]:
    """`n` pairs from `seed` (the same pairs for the same arguments)."""
    if n < 1:
        raise ValueError(f"--random needs at least 1 pair, not {n}")
    rng = random.Random(seed)
    pairs = []
    for i in range(n):
        layers = 2 * rng.randint(LAYERS[0] // 2, LAYERS[1] // 2)
        hidden = rng.choice(HIDDEN)
        rtt = 0.0 if rng.random() < 0.25 else round(rng.uniform(*RTT_MS), 1)
        rate = rng.choice(RATES)
        cap = f"{rate / 1e6:.0f} Mbit/s" if rate else "uncapped"
        pairs.append(Pair(i, layers, hidden, LinkProfile(f"{rtt:g} ms, {cap}", rtt, rate)))
    return pairs


def within(measured: float | None, predicted: float, tolerance: float = TOLERANCE) -> bool | None:
    """Whether the prediction is within ±tolerance of the measurement (None: nothing measured)."""
    if measured is None or not math.isfinite(measured) or measured <= 0:
        return None
    return abs(predicted - measured) <= tolerance * measured


def share_within(pairs: Iterable[tuple[float | None, float]], tolerance: float = TOLERANCE) -> tuple[int, int]:
    """(within, compared) over (measured, predicted) figures; unmeasured ones are not compared."""
    verdicts = [v for m, p in pairs if (v := within(m, p, tolerance)) is not None]
    return sum(verdicts), len(verdicts)
