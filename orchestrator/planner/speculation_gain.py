"""What speculative decoding should gain on a plan (pure): one verification pass against plain steps.

A request drafting d tokens sends d + 1 positions through every stage in one pass
(engine/coordinator/pipeline.py); the last stage scores all of them and returns the accepted
drafts plus one token (engine/stage/speculate.py). A pass therefore costs each stage a step of
d + 1 rows (the same matmul shapes as a decode batch of d + 1 requests; SOLO, every core, as one
request's steps are) and the hops carry d + 1 hidden states; it yields 1 + a x d tokens at a
per-draft acceptance a. The gain over plain decoding is that many tokens per pass times a
plain token's time, divided by the pass's time (`predict.pass_ms`).

The acceptance depends on the workload, not the machine: greedy drafting and verification are
deterministic. `MEASURED` holds what the benchmark (e2e/bench/speculation.py, docs/benchmark.md)
measured per workload on the demo model; the plan preview predicts at those.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict


class Workload(BaseModel):
    """A workload's acceptance as measured: drafted tokens per pass and the share accepted."""

    model_config = ConfigDict(frozen=True)

    name: str
    drafts_per_pass: float
    acceptance: float  # accepted / drafted


class Gain(BaseModel):
    """The predicted effect of speculation on one request of a workload."""

    model_config = ConfigDict(frozen=True)

    workload: str
    tokens_per_pass: float
    decode_tps: float  # one request, speculating
    gain: float  # ÷ plain decoding


# e2e/bench/speculation.py on SmolLM2-135M-Instruct, --draft 4 --tokens 48, greedy, 1 request (docs/benchmark.md,
# "Speculative decoding", 2026-12-02): accepted ÷ drafted, and drafted per pass = (tokens per pass - 1) ÷ that.
MEASURED: tuple[Workload, ...] = (
    Workload(name="code edit", drafts_per_pass=2.37, acceptance=0.52),  # 2.23 tokens per pass
    Workload(name="tool-call arguments", drafts_per_pass=1.93, acceptance=0.15),  # 1.29 tokens per pass
)


def gains(plain_ms: float, pass_ms_of: dict[int, float], max_drafts: int,
          workloads: Sequence[Workload] = MEASURED) -> tuple[Gain, ...]:
    """Per workload: tokens per pass, tok/s and gain, drafting at most `max_drafts` per pass.
    `pass_ms_of[d]`: a pass of d drafts (d + 1 positions) for each d from 1 to `max_drafts`."""
    out = []
    for w in workloads:
        drafts = max(1, min(max_drafts, round(w.drafts_per_pass)))
        tokens = 1 + w.acceptance * drafts
        seconds = pass_ms_of[drafts] / 1000
        out.append(Gain(workload=w.name, tokens_per_pass=tokens, decode_tps=tokens / seconds,
                        gain=tokens * plain_ms / pass_ms_of[drafts]))
    return tuple(out)


__all__ = ["Gain", "MEASURED", "Workload", "gains"]
