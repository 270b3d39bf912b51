"""Samples for the live charts (pure): the coordinator's token counter read from its Prometheus
text, turned into tokens/s between two looks, plus the per-stage step latency.

The watcher does the I/O (GET /metrics, GET /health) and keeps the previous reading; these
functions only compute, so they are tested without any process.
"""

from __future__ import annotations

from typing import Iterable

from orchestrator.control.rules.state import Sample, StageStatus

TOKENS_METRIC = "pipeserve_generated_tokens_total"
IN_FLIGHT_METRIC = "pipeserve_requests_in_flight"

Reading = tuple[float, float]  # (monotonic seconds when read, counter value)


def metric_value(text: str, name: str) -> float | None:
    """The value of the unlabelled series `name` in Prometheus exposition text, else None.

    Comments, other series, labelled series (`name{...}`) and an optional trailing
    timestamp are handled; a malformed value reads as None.
    """
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 2 or parts[0].startswith("#"):
            continue
        series = parts[0][:-2] if parts[0].endswith("{}") else parts[0]
        if series == name:
            try:
                return float(parts[1])
            except ValueError:
                return None
    return None


def tokens_per_second(previous: Reading | None, current: Reading | None) -> float | None:
    """Generated tokens per second between two readings (one decimal), or None when unknown:
    a reading is missing, time did not advance, or the counter went back (a restarted coordinator)."""
    if previous is None or current is None:
        return None
    dt, dn = current[0] - previous[0], current[1] - previous[1]
    if dt <= 0 or dn < 0:
        return None
    return round(dn / dt, 1)


RATE_READINGS = 5  # a rate spans the last 5 readings (about 2 s): single tokens do not make spikes
KEPT_READINGS = 75  # about 30 s: how far back a slow decode's last token is looked for


def remember(readings: tuple[Reading, ...], reading: Reading | None,
             keep: int = KEPT_READINGS) -> tuple[Reading, ...]:
    """The readings to rate over after a new one: the last `keep`; an unreadable counter, or one
    that went back (a restarted coordinator), starts over."""
    if reading is None:
        return ()
    if readings and reading[1] < readings[-1][1]:
        return (reading,)
    return (readings + (reading,))[-keep:]


def recent_rate(readings: tuple[Reading, ...], busy: bool = False) -> float | None:
    """Generated tokens/s across the last RATE_READINGS readings (None until there are two).

    While a request is in flight (`busy`) but no token came in that window (a slow decode, a
    token every few seconds), the rate spans back to the reading before the last token instead:
    a request decoding at 0.3 tok/s reads about 0.3, not a flicker between 0.0 and 0.5."""
    if len(readings) < 2:
        return None
    rate = tokens_per_second(readings[-RATE_READINGS:][0], readings[-1])
    if busy and rate == 0:
        before = next((r for r in reversed(readings) if r[1] < readings[-1][1]), None)
        if before is not None:
            rate = tokens_per_second(before, readings[-1])
    return rate


def sample(at: float, tokens_per_s: float | None, statuses: Iterable[StageStatus]) -> Sample:
    """A sample from one look: throughput and each stage's step latency (two decimals)."""
    return Sample(at=at, tokens_per_s=tokens_per_s,
                  step_ms=tuple(None if s.step_ms is None else round(s.step_ms, 2) for s in statuses))


def same_reading(last: Sample | None, new: Sample) -> bool:
    """Whether `new` shows nothing that `last` did not (its time aside): then it is not posted,
    so an idle cluster pushes no identical renders."""
    return last is not None and last.tokens_per_s == new.tokens_per_s and last.step_ms == new.step_ms
