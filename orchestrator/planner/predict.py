"""Predicted performance of a pipeline (pure): decode speed, aggregate throughput, time to
first token, the bottleneck, and a verdict against one node alone.

The model follows what the coordinator's scheduler does (engine/coordinator/pipeline.py):
- one request: a token passes every stage in order (each using all its cores: SOLO), every
  boundary once with one hidden state, and returns to the coordinator with the sampled id;
- N requests: decode steps go in micro-batches of b = ceil(N / S) rows, at most one group per
  stage in flight; a group's round takes the sum of its stages and links, and no resource
  (stage, or link serialization) can serve groups faster than its own time per group;
- a prompt is prefilled in `prefill_step` chunks that are all sent at once: a stage starts
  chunk j as soon as it finished chunk j-1 and chunk j has crossed the link from the stage
  before (a flow shop), so a slow link only delays the first chunk's arrival. Stages whose
  nodes share one physical machine (several agents on one host, as on the emulated LAN) share
  its cores: a prompt's chunks run SOLO (every core), and two at once each get a share, so the
  machine gets through their work at most k x t_solo / t_base times as fast as one stage after
  the other (k stages; a step's time on all cores against its base threads: what spreading a
  step over more cores gains). Decode steps of many requests use the base threads (one each
  when agents share a host): those overlap as before.
Every step also costs what the stages and the coordinator do beyond the layer math (frames,
queues, conversions, sampling's encode, streaming): measured on the node through the real
code (engine/profiling/step.py), per rows, and added to each stage's step and to each round.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from orchestrator.planner.perf_inputs import LOCAL_LINK, LayerTiming, LinkCost
from orchestrator.planner.speculation_gain import Gain, gains

HEADER_BYTES = 36  # a frame's header (engine/wire.py)
RESULT_BYTES = 64  # a sampled token's RESULT frame, generously
# The coordinator's work per step when the profile did not measure it (profiles from before
# engine/profiling/step.py): docs/benchmark.md measured ~0.1 ms, plus slack.
COORDINATOR_MS = 0.3
DEFAULT_REQUESTS = (4, 8, 16)
DEFAULT_PROMPTS = (1024, 8192)


class StageSpec(BaseModel):
    """One stage as the model needs it."""

    model_config = ConfigDict(frozen=True)

    label: str  # 'stage 1 (node-b, layers 15–29)'
    node_name: str
    layer_weight: float  # its layers in units of an average layer (bytes-weighted)
    last: bool
    timing: LayerTiming
    machine: str = ""  # the physical machine its node runs on ("": its own, shared with no other stage)


class Boundary(BaseModel):
    """What one hop costs: stage k -> k+1, or the last stage back to the coordinator."""

    model_config = ConfigDict(frozen=True)

    source: str
    target: str
    link: str  # '0.30 ms, 0.94 Gbit/s'
    interface: str
    measured: bool
    ms_per_token: float  # one request's hidden state (or result) crossing it


class Point(BaseModel):
    """One x, y of a prediction: requests -> tok/s, or prompt tokens -> seconds."""

    model_config = ConfigDict(frozen=True)

    x: int
    y: float


class Performance(BaseModel):
    """A plan's predicted performance."""

    model_config = ConfigDict(frozen=True)

    decode_tps_1: float  # tokens/s for one request
    ms_per_token_1: float
    compute_ms_1: float  # of which the stages compute
    aggregate_tps: tuple[Point, ...]  # requests -> tokens/s over all of them
    ttft_s: tuple[Point, ...]  # prompt tokens -> seconds to the first token
    stage_ms_1: tuple[float, ...]  # each stage's decode step for one request
    boundaries: tuple[Boundary, ...]
    bottleneck: str
    single_node: str | None = None  # the verdict against one node alone, when one could hold the model
    timing_note: str = ""  # where the compute timings come from
    automatic: str | None = None  # a manual split: what the automatic one would predict, to compare
    speculation: tuple[Gain, ...] = ()  # with speculative decoding on: the gain per measured workload

    def aggregate(self, requests: int) -> float | None:
        """Predicted tokens/s at `requests` (None when not predicted)."""
        return next((p.y for p in self.aggregate_tps if p.x == requests), None)

    def ttft(self, prompt: int) -> float | None:
        """Predicted seconds to the first token of a `prompt`-token prompt."""
        return next((p.y for p in self.ttft_s if p.x == prompt), None)


def stage_step_ms(stage: StageSpec, rows: int, solo: bool = False) -> float:
    """One decode step of `rows` requests on a stage: its layers, the head on the last one,
    and the stage's own path around them (frames in and out, conversions, sampling's encode)."""
    t = stage.layer_weight * stage.timing.layer_ms(rows, solo) + stage.timing.step_overhead_ms(rows, stage.last)
    return t + (stage.timing.head_ms(rows, solo) if stage.last else 0.0)


def verify_step_ms(stage: StageSpec, positions: int) -> float:
    """One request's verification chunk of `positions` on a stage: a step of that many rows
    (the same matmuls as a decode batch), on every core as one request's steps run."""
    t = stage.timing
    solo = t.layer_ms_b1_solo / t.layer_ms_b1 if t.layer_ms_b1 > 0 else 1.0
    ms = stage.layer_weight * t.layer_ms(positions) * solo + t.step_overhead_ms(1, stage.last)
    if stage.last:
        head_solo = t.head_ms_b1_solo / t.head_ms_b1 if t.head_ms_b1 > 0 else 1.0
        ms += t.head_ms(positions) * head_solo
    return ms


def stepwise_step_ms(stage: StageSpec, positions: int) -> float:
    """One request's verification chunk of `positions` on a stage of a family that verifies one position
    at a time (families/support.py STEPWISE): that many one-row steps, nothing batched, in one frame."""
    overhead = stage.timing.step_overhead_ms(1, stage.last)
    return positions * (verify_step_ms(stage, 1) - overhead) + overhead


def pass_ms(stage_ms: Sequence[float], links: Sequence[LinkCost], hidden_bytes: int, positions: int,
            coordinator: float) -> float:
    """One request's pass of `positions` positions through every stage (1: a decode step; more: a
    verification chunk): the stages' steps (`stage_ms`), the hidden states across each boundary, a
    RESULT per position back, the coordinator."""
    hops = sum(links[k].transfer_ms(positions * hidden_bytes + HEADER_BYTES) for k in range(len(stage_ms) - 1))
    return sum(stage_ms) + hops + links[-1].transfer_ms(positions * RESULT_BYTES) + coordinator


def speculation_gains(stages: Sequence[StageSpec], links: Sequence[LinkCost], hidden_bytes: int,
                      max_drafts: int, replays: bool = False, stepwise: bool = False) -> tuple[Gain, ...]:
    """What drafting up to `max_drafts` tokens per pass gains one request, per measured workload.
    `replays`: the family's caches cannot trim, so a partly accepted pass is replayed on every stage
    in front of the next step (its r positions on top of that step's one; no extra hop). `stepwise`:
    the family verifies (and replays) one position at a time, so d + 1 positions cost every stage d + 1
    one-row steps; the pass still crosses each boundary once."""
    if max_drafts <= 0:
        return ()
    drafts = range(1, max_drafts + 1)
    step = stepwise_step_ms if stepwise else verify_step_ms
    passes = {d: pass_ms([step(s, d + 1) for s in stages], links, hidden_bytes, d + 1,
                         coordinator_ms(stages, 1)) for d in drafts}
    replay = {r: sum(step(s, r + 1) - step(s, 1) for s in stages) for r in drafts} if replays else None
    return gains(decode_ms_1(stages, links, hidden_bytes)[0], passes, max_drafts, replay_ms_of=replay)


def coordinator_ms(stages: Sequence[StageSpec], rows: int) -> float:
    """The coordinator's work per step of `rows` requests, as timed on its node (stage 0's);
    COORDINATOR_MS for a profile that did not measure it."""
    measured = stages[0].timing.coordinator_ms(rows) if stages else 0.0
    return measured if measured > 0 else COORDINATOR_MS


def decode_ms_1(stages: Sequence[StageSpec], links: Sequence[LinkCost], hidden_bytes: int) -> tuple[float, float]:
    """(ms per token, of which compute) for one request. links[k] joins stage k to k+1; the
    last one joins the last stage to the coordinator (on stage 0's node)."""
    steps = [stage_step_ms(s, 1, solo=True) for s in stages]
    return pass_ms(steps, links, hidden_bytes, 1, coordinator_ms(stages, 1)), sum(steps)


def group_times(stages: Sequence[StageSpec], links: Sequence[LinkCost], hidden_bytes: int,
                rows: int) -> tuple[list[float], list[float], float]:
    """Per group of `rows` requests: each stage's step, each link's busy (serialization)
    time, and the whole round (stages, links' latency and serialization, coordinator)."""
    steps = [stage_step_ms(s, rows) for s in stages]
    sizes = [rows * (hidden_bytes + HEADER_BYTES)] * (len(stages) - 1) + [rows * RESULT_BYTES]
    busy = [n * 1000 / link.bandwidth_Bps for n, link in zip(sizes, links)]
    round_ms = sum(steps) + sum(link.transfer_ms(n) for n, link in zip(sizes, links)) + coordinator_ms(stages, rows)
    return steps, busy, round_ms


def aggregate_tps(stages: Sequence[StageSpec], links: Sequence[LinkCost], hidden_bytes: int, requests: int,
                  max_batch: int = 16) -> float:
    """Tokens/s over `requests` concurrent decoding requests."""
    if requests <= 1:
        return 1000 / decode_ms_1(stages, links, hidden_bytes)[0]
    depth = len(stages)
    rows = min(max_batch, math.ceil(requests / depth))
    groups = min(depth, math.ceil(requests / rows))
    steps, busy, round_ms = group_times(stages, links, hidden_bytes, rows)
    # A cycle of `groups` groups: no faster than one round, nor than the busiest resource
    # serving every group once.
    period = max(round_ms, groups * max(steps + busy))
    return groups * rows * 1000 / period


def ttft_s(stages: Sequence[StageSpec], links: Sequence[LinkCost], hidden_bytes: int, prompt: int,
           prefill_step: int = 2048) -> float:
    """Seconds from submission to the first token of a `prompt`-token prompt (one request)."""
    chunks = [(s, min(prefill_step, prompt - 1 - s)) for s in range(0, max(0, prompt - 1), prefill_step)]
    # Each chunk also takes the stage's own path once (one frame in, one out).
    work = [[stage.layer_weight * stage.timing.prefill_ms(start, n) + stage.timing.step_overhead_ms(1, False)
             for start, n in chunks] for stage in stages]
    # The last prompt token samples: a decode step behind the chunks, at the prompt's length.
    last = [max(0.0, stage_step_ms(stage, 1, solo=True) + stage.layer_weight * (
        stage.timing.prefill_ms(prompt - 1, 1) - stage.timing.prefill_ms(0, 1))) for stage in stages]
    done = [0.0] * len(stages)  # when each stage finished its previous item
    for j, (_, n) in enumerate(chunks):
        arrive = 0.0
        for k in range(len(stages)):
            done[k] = max(done[k], arrive) + work[k][j]
            if k < len(stages) - 1:
                arrive = done[k] + links[k].transfer_ms(n * hidden_bytes + HEADER_BYTES)
    arrive = 0.0
    for k in range(len(stages)):
        done[k] = max(done[k], arrive) + last[k]
        link, size = (links[k], hidden_bytes + HEADER_BYTES) if k < len(stages) - 1 else (links[-1], RESULT_BYTES)
        arrive = done[k] + link.transfer_ms(size)
    # A shared machine gets through its stages' work no faster than its cores allow.
    busiest = max((sum(sum(work[k]) + last[k] for k in ks) / _shared_speedup([stages[k] for k in ks])
                   for ks in shared_machines(stages)), default=0.0)
    return (max(arrive, busiest) + coordinator_ms(stages, 1)) / 1000


def shared_machines(stages: Sequence[StageSpec]) -> list[list[int]]:
    """The stages (indices) of each physical machine that runs more than one of them."""
    by_machine: dict[str, list[int]] = {}
    for k, s in enumerate(stages):
        if s.machine:
            by_machine.setdefault(s.machine, []).append(k)
    return [ks for ks in by_machine.values() if len(ks) > 1]


def _shared_speedup(stages: Sequence[StageSpec]) -> float:
    """How much faster than one after the other k SOLO steps run at once on one machine: k x
    t_solo / t_base (each gets a share of the cores, like its base threads), between 1 and k."""
    ratio = sum(s.timing.layer_ms_b1_solo / s.timing.layer_ms_b1 for s in stages) / len(stages)
    return min(float(len(stages)), max(1.0, len(stages) * ratio))


def bottleneck(stages: Sequence[StageSpec], links: Sequence[LinkCost], hidden_bytes: int, requests: int,
               max_batch: int = 16) -> str:
    """What limits throughput at `requests` concurrent requests, in words."""
    depth = len(stages)
    rows = min(max_batch, math.ceil(requests / depth))
    groups = min(depth, math.ceil(requests / rows))
    steps, busy, round_ms = group_times(stages, links, hidden_bytes, rows)
    resources = [(t, f"{s.label}: {t:.1f} ms per step of {rows}") for s, t in zip(stages, steps)]
    names = [s.node_name for s in stages]
    for k, t in enumerate(busy[:-1]):
        resources.append((t, f"link {names[k]} → {names[k + 1]}: {t:.2f} ms per step of {rows}"))
    worst_t, worst = max(resources, key=lambda r: r[0])
    hops = round_ms - sum(steps)
    if round_ms > groups * worst_t and hops > 0.25 * round_ms:
        return f"link latency: {hops:.1f} ms of every {round_ms:.1f} ms round is spent between stages"
    return worst


def predict(stages: Sequence[StageSpec], links: Sequence[LinkCost], hidden_bytes: int, *,
            prefill_step: int = 2048, max_batch: int = 16, requests: Sequence[int] = DEFAULT_REQUESTS,
            prompts: Sequence[int] = DEFAULT_PROMPTS, timing_note: str = "",
            speculative_tokens: int = 0, replays: bool = False, stepwise: bool = False) -> Performance:
    """The whole prediction for one placement. `links` has one entry per stage (see decode_ms_1);
    `speculative_tokens` > 0: also what speculative decoding gains (speculation_gain.py), with the
    replay of partly accepted passes when `replays` (a family whose caches cannot trim), verified one
    position at a time when `stepwise` (families/support.py STEPWISE)."""
    if len(links) != len(stages) or not stages:
        raise ValueError(f"{len(stages)} stages need {len(stages)} links (the last one back to the coordinator)")
    ms1, compute = decode_ms_1(stages, links, hidden_bytes)
    names = [s.node_name for s in stages]
    bounds = [Boundary(source=names[k], target=names[k + 1] if k < len(stages) - 1 else f"coordinator ({names[0]})",
                       link=links[k].label, interface=links[k].interface, measured=links[k].measured,
                       ms_per_token=links[k].transfer_ms(hidden_bytes + HEADER_BYTES if k < len(stages) - 1
                                                         else RESULT_BYTES))
              for k in range(len(stages))]
    return Performance(
        decode_tps_1=1000 / ms1, ms_per_token_1=ms1, compute_ms_1=compute,
        aggregate_tps=tuple(Point(x=n, y=aggregate_tps(stages, links, hidden_bytes, n, max_batch)) for n in requests),
        ttft_s=tuple(Point(x=p, y=ttft_s(stages, links, hidden_bytes, p, prefill_step)) for p in prompts),
        stage_ms_1=tuple(stage_step_ms(s, 1, solo=True) for s in stages), boundaries=tuple(bounds),
        bottleneck=bottleneck(stages, links, hidden_bytes, max(requests, default=1), max_batch),
        timing_note=timing_note, speculation=speculation_gains(stages, links, hidden_bytes, speculative_tokens,
                                                                  replays, stepwise))


def single_node_verdict(split: Performance, single: Performance, node_name: str) -> str:
    """'a single node (node-a) would be ~1.6× faster for one request; the split serves 2.3× more
    tokens/s at 16 requests'."""
    r1 = single.decode_tps_1 / split.decode_tps_1
    if r1 >= 1.05:
        one = f"a single node ({node_name}) would be ~{r1:.1f}× faster for one request"
    elif r1 <= 1 / 1.05:
        one = f"the split is ~{1 / r1:.1f}× faster for one request than {node_name} alone"
    else:
        one = f"the split is about as fast as {node_name} alone for one request"
    n = max((p.x for p in split.aggregate_tps), default=1)
    mine, theirs = split.aggregate(n), single.aggregate(n)
    if not mine or not theirs:
        return one
    rn = mine / theirs
    if rn >= 1.05:
        many = f"the split serves {rn:.1f}× more tokens/s at {n} requests"
    elif rn <= 1 / 1.05:
        many = f"{node_name} alone would serve {1 / rn:.1f}× more tokens/s at {n} requests"
    else:
        many = f"both serve about the same tokens/s at {n} requests"
    return f"{one}; {many}"


def single_node_stages(timing: LayerTiming, num_layers: float,
                       node_name: str) -> tuple[list[StageSpec], list[LinkCost]]:
    """The whole model on one node: one stage, the coordinator beside it."""
    return ([StageSpec(label=f"{node_name} alone", node_name=node_name, layer_weight=num_layers, last=True,
                       timing=timing)], [LOCAL_LINK])
