"""Whether a node's timing of a model's layers can be trusted (pure): the busy-machine rule.

A timing taken while other work shares the cores comes out slow, and unevenly so: the
same step timed twice disagrees, or a step of several rows comes out faster than a step of
one (impossible on a quiet machine: the rows share one pass through the weights, and the
one-row step was slowed by something else). A prediction built on such figures contradicts
itself (0.5 tok/s for one request, 23.9 at four). The agent times again a bounded number of
times while this rule finds a doubt (agent/compute.py), and a doubt left after the last try
goes with the profile to the plan card, which says so instead of showing the figures as fact.
"""

from __future__ import annotations

from collections.abc import Sequence

BUSY_LOAD = 0.75  # a 1-minute load above this share of the CPUs: timings run slow
SPREAD_LIMIT = 0.25  # the rounds of one step disagreeing by more than this share
BATCH_SLACK = 1.25  # a step of several rows may be at most this much faster than one row's (noise)


def timing_doubt(*, layer_ms_b1: float, rows: Sequence[tuple[int, float]] = (), spread: float = 0.0,
                 load: float = 0.0, cpus: int = 0) -> str:
    """Why the timing looks taken on a busy machine ("" when it does not): `rows` are
    (rows, ms per layer) of steps of more than one row, `spread` the largest relative
    difference between the rounds of one timed step, `load` the 1-minute load average on
    `cpus` CPUs when the timing started (0: unknown)."""
    reasons = []
    if cpus and load > BUSY_LOAD * cpus:
        reasons.append(f"load {load:.1f} on {cpus} CPUs")
    if spread > SPREAD_LIMIT:
        reasons.append(f"the same step timed {100 * spread:.0f} % apart from one round to the next")
    faster = [(r, ms) for r, ms in rows if r > 1 and ms > 0 and layer_ms_b1 > BATCH_SLACK * ms]
    if faster:
        r, ms = min(faster, key=lambda x: x[1])
        reasons.append(f"a step of {r} rows timed faster ({ms:.2f} ms a layer) than one of 1 row "
                       f"({layer_ms_b1:.2f} ms)")
    return "; ".join(reasons)


def profile_doubt(profile: object) -> str:
    """`timing_doubt` of a compute profile (agent/perf_schemas.ComputeProfile or its dict)."""
    def get(name: str, default: object = 0.0) -> object:
        return profile.get(name, default) if isinstance(profile, dict) else getattr(profile, name, default)

    rows = [tuple(r) for r in get("layer_ms_rows", ()) or ()]  # type: ignore[union-attr]
    batch, bb = get("batch", 0), get("layer_ms_bB", 0.0)
    if batch and bb:
        rows.append((batch, bb))
    return timing_doubt(layer_ms_b1=float(get("layer_ms_b1")), rows=rows,  # type: ignore[arg-type]
                        spread=float(get("spread")), load=float(get("load")), cpus=int(get("cpus", 0)))  # type: ignore[arg-type]
