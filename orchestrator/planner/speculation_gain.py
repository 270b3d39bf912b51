"""What speculative decoding should gain on a plan (pure): one verification pass against plain steps.

A request drafting d tokens sends d + 1 positions through every stage in one pass
(engine/coordinator/pipeline.py); the last stage scores all of them and returns the accepted
drafts plus one token (engine/stage/speculate.py). A pass therefore costs each stage a step of
d + 1 rows (the same matmul shapes as a decode batch of d + 1 requests; SOLO, every core, as one
request's steps are) and the hops carry d + 1 hidden states; it yields 1 + a x d tokens at a
per-draft acceptance a. The gain over plain decoding is that many tokens per pass times a
plain token's time, divided by the pass's time (`predict.pass_ms`).

A family whose caches cannot trim (sliding windows, recurrent states) rolls a partly accepted pass
back by replaying its accepted positions in front of the next step (engine/stage/rewind.py): that step
runs accepted + 2 rows instead of one. The replay's price is added for each pass that does not accept
every draft (taken as 1 - a^d, drafts accepted independently), at the pass's mean accepted count.

A family whose chunk of positions is not its decode steps (PLaMo 3: families/support.py STEPWISE) verifies
one position at a time: a pass of d drafts costs every stage d + 1 one-row steps (nothing batched, so the
pass saves the hops and the coordinator's turns, not compute) plus one hop per boundary, and its replay
r more one-row steps (predict.stepwise_step_ms); the plan's timing note says so. DeepSeek-V4.1, split or
not, predicts as any family that replays.

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


# e2e/bench/speculation.py's workloads on SmolLM2-135M-Instruct, speculative_tokens = 4, greedy, 1 request of
# at most 96 tokens each, prompt lookup from two-token matches (docs/benchmark.md, 2026-12-04 19:06 UTC):
# drafted ÷ passes and accepted ÷ drafted from the coordinator's /metrics, the same as
# e2e/bench/lookup_replay.py replays from the model's answers.
MEASURED: tuple[Workload, ...] = (
    Workload(name="code edit", drafts_per_pass=3.22, acceptance=0.62),  # 8 passes, 26 drafted, 16 accepted
    Workload(name="tool-call arguments", drafts_per_pass=2.2, acceptance=0.36),  # 5 passes, 11 drafted, 4 accepted
    Workload(name="free chat", drafts_per_pass=2.0, acceptance=0.12),  # 4 passes, 8 drafted, 1 accepted
)


def gains(plain_ms: float, pass_ms_of: dict[int, float], max_drafts: int,
          workloads: Sequence[Workload] = MEASURED, replay_ms_of: dict[int, float] | None = None) -> tuple[Gain, ...]:
    """Per workload: tokens per pass, tok/s and gain, drafting at most `max_drafts` per pass.
    `pass_ms_of[d]`: a pass of d drafts (d + 1 positions) for each d from 1 to `max_drafts`;
    `replay_ms_of[r]`, for a family that rolls back by replay: what replaying r positions adds to the
    next step, for each r from 1 to `max_drafts`."""
    out = []
    for w in workloads:
        drafts = max(1.0, min(float(max_drafts), w.drafts_per_pass))  # the adaptive length's average
        ms = _between(pass_ms_of, drafts, max_drafts)
        tokens = 1 + w.acceptance * drafts
        if replay_ms_of:
            ms += (1 - w.acceptance ** drafts) * _between(replay_ms_of, min(float(max_drafts), tokens), max_drafts)
        out.append(Gain(workload=w.name, tokens_per_pass=tokens, decode_tps=tokens * 1000 / ms,
                        gain=tokens * plain_ms / ms))
    return tuple(out)


def _between(ms_of: dict[int, float], x: float, top: int) -> float:
    """`ms_of` at a mean length x (1 <= x <= top), linear between whole lengths."""
    low = int(x)
    high = min(top, low + 1)
    return ms_of[low] + (ms_of[high] - ms_of[low]) * (x - low)


__all__ = ["Gain", "MEASURED", "Workload", "gains"]
