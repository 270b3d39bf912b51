"""Time a model's layers on this machine: `python -m orchestrator.engine.profiling.layers --model DIR --out FILE`.

The node agent runs this in a child process (the agent itself never imports mlx) and caches
the answer per model. It loads the model as two stages — every layer but the last (with the
embedding), and the last layer with the final norm and head — and times, as a stage runs them:
- one decode step for one request with every core (what a SOLO step gets), and with the
  stage's base BLAS threads; one decode step of B requests together (base threads);
- a prefill chunk at context 0 and one behind FAR_CONTEXT cached tokens, which give the
  per-token cost and its growth with the context already cached (attention);
The last stage's time minus one layer is the head's (norm, head, log-softmax, sampling).
Then what a step costs beyond the layers, through the stage's and the coordinator's own code
(engine/profiling/step.py): frames, queues, conversions, sampling's encode, streaming.
The body is not every layer but a few that stand for all (families/layer_kinds.py: the
shortest run from the first layer whose kinds come in the model's shares; two layers of a
model whose layers are all alike), divided by their count as all of them were, each step
behind a read of as many bytes as the untimed layers' weights (so the cache holds what serving
leaves there): timing every layer took minutes on a busy machine (issue 41 item 3).
`--all-layers` times them all.
Prints nothing but errors; writes one JSON object (agent/perf_schemas.ComputeProfile).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import struct
import sys
import time
from pathlib import Path
from typing import Any, Callable

from orchestrator import settings
from orchestrator.families import layer_kinds, support

CONTEXT = 32  # tokens in each cache before decode steps are timed
REPEATS = 5
# Every decode timing is taken in ROUNDS passes over all the row counts, the lower median kept: a
# load spike only ever adds, and one spike in one median of five skewed a whole profile (a
# 2-thread head step of 55 ms where the rounds before and after measured 10: a prediction
# 34 % too slow for one request), while a steady load stays in every round's median.
ROUNDS = 2
# The growth of prefill cost with context is a difference of two timings divided by the
# context between them: 1024 tokens apart, load noise of a few % stays a few % of the growth
# (two chunks 256 tokens apart amplified it 4x: 1.2 ms/token/k against a base of 0.7 under load,
# where attention over 1k tokens costs a fraction of a layer's matmuls).
# Prefill chunks are timed at the engine's own size (prefill_step_size, 2048 by default): on a
# CPU, attention over a chunk materializes chunk x context scores per head, and its cost per
# token grows far faster with context at 2048-token chunks than at 256 (an 8k prompt measured
# 2x what 256-token chunks predicted).
FAR_CONTEXT = 2048
# Prefill is timed on this many layers (each costs the same): filling FAR_CONTEXT tokens
# through every layer would take most of the profile's time on a slow CPU.
PREFILL_LAYERS = 4
# ... and on fewer when a first look says the two rounds would take longer than this (mlx's reference
# BLAS, where OpenBLAS cannot run, is ~100x slower at prefill: a profile must still end in minutes).
PREFILL_BUDGET_S = 10.0
# Decode steps are also timed at these row counts (those between 1 and the batch): the cost
# of a step is far from linear in its rows (a batched step's fixed costs; 2-4 rows cost most
# of what 8 do), and groups of 2-4 rows are what 4-8 requests over 2 stages run.
MID_ROWS = (2, 4)
# With a few layers timed instead of all, a step reads fewer weights than serving's: the body's
# steps, and the tail's behind a step of the body (see `profile`), are timed behind a read of
# the untimed layers' bytes, so the cache holds what serving leaves there; at most twice the
# last-level cache (more evicts nothing more: SmolLM2's 27 untimed layers are 382 MB, a read
# that took most of a 2-minute timing on a loaded machine), or this where its size is unknown.
SWEEP_MAX_BYTES = 1 << 30
SWEEP_CACHES = 2
CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")


def _median_ms(fn: Callable[[], Any], repeats: int = REPEATS, before: Callable[[], Any] | None = None) -> float:
    fn()  # warm-up: kernels, buffers
    times = []
    for _ in range(repeats):
        if before is not None:
            before()  # untimed
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def time_stage(model: Any, batch: int, set_threads: Callable[[bool], None],
               between: Callable[[], Any] | None = None, spreads: dict[str, float] | None = None) -> dict[str, float]:
    """Decode ms at 1 request (solo, base) and at MID_ROWS and `batch` requests (base) for one
    StageModel; `between` runs (untimed) before each timed step. `spreads` gets, per step, how
    far its rounds disagree (max / min - 1): a busy machine's sign (agent/timing_doubt.py)."""
    import mlx.core as mx

    def inputs(rows: int, length: int) -> list[mx.array]:
        if model.first:
            return [mx.zeros((1, length), mx.int32) + (7 + r) for r in range(rows)]
        return [mx.random.normal((1, length, model.info.hidden_size)).astype(model.dtype) for _ in range(rows)]

    def fresh(rows: int) -> list[list[Any]]:
        caches = [model.make_cache() for _ in range(rows)]
        for x, c in zip(inputs(rows, CONTEXT), caches):
            mx.eval(model.forward(x, c), [e.state for e in c])
        return caches

    def step(xs: list[mx.array], caches: list[list[Any]]) -> None:
        outs = model.forward_batch(xs, caches) if len(xs) > 1 else [model.forward(xs[0], caches[0])]
        if model.last:
            outs = [model.logprobs(o).argmax(axis=-1) for o in outs]
        mx.eval(outs, [e.state for c in caches for e in c])

    out: dict[str, float] = {}
    mid = [(f"b{r}", r, False) for r in MID_ROWS if 1 < r < batch]
    for _ in range(ROUNDS):
        for key, rows, solo in (("b1_solo", 1, True), ("b1", 1, False), *mid, ("bB", batch, False)):
            set_threads(solo)
            caches, xs = fresh(rows), inputs(rows, 1)
            t = _median_ms(functools.partial(step, xs, caches), before=between)
            if spreads is not None and key in out and min(t, out[key]) > 0:
                spreads[key] = max(spreads.get(key, 0.0), max(t, out[key]) / min(t, out[key]) - 1)
            out[key] = min(t, out.get(key, t))
    return out


def cache_bytes(size: str) -> int:
    """Bytes of a sysfs cache size ("32768K", "2M", "512"); 0 when it is not one (pure)."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = size.strip().upper()
    try:
        return int(text[:-1]) * units[text[-1]] if text[-1:] in units else int(text)
    except ValueError:
        return 0


def sweep_limit(cache_dir: Path = CACHE_DIR) -> int:
    """The most bytes a sweep reads: SWEEP_CACHES x this CPU's last-level cache (sysfs), or
    SWEEP_MAX_BYTES where that cannot be read."""
    sizes = []
    for index in cache_dir.glob("index*"):
        try:
            sizes.append((int((index / "level").read_text()), cache_bytes((index / "size").read_text())))
        except (OSError, ValueError):
            continue
    last = max(sizes, default=(0, 0))[1]
    return min(SWEEP_MAX_BYTES, SWEEP_CACHES * last) if last else SWEEP_MAX_BYTES


def _sweep(nbytes: int) -> Callable[[], None] | None:
    """A read of `nbytes` of scratch memory (None when there is nothing to read): it stands, between
    timed steps, for the weights of the layers serving runs and this timing does not, so the cache
    holds what serving leaves there (a few layers timed back to back stay in a 32 MiB L3 and came
    out 10-20 % faster per layer than all of them)."""
    import mlx.core as mx

    if nbytes < 4:
        return None
    scratch = mx.ones((nbytes // 4,), mx.float32)
    mx.eval(scratch)
    return lambda: mx.eval(scratch.sum())


def _decode_step(model: Any, sweep: Callable[[], None] | None = None) -> Callable[[], None]:
    """One decode step of one request through `model`, to run between timed steps, then `sweep`."""
    import mlx.core as mx

    cache = model.make_cache()
    x = mx.zeros((1, 1), mx.int32) + 7 if model.first else \
        mx.random.normal((1, 1, model.info.hidden_size)).astype(model.dtype)

    def step() -> None:
        mx.eval(model.forward(x, cache), [e.state for e in cache])
        if sweep is not None:
            sweep()

    return step


def time_body(body: Any, layers: int, batch: int, set_threads: Callable[[bool], None],
              sweep: Callable[[], None] | None = None, spreads: dict[str, float] | None = None) -> dict[str, float]:
    """Per-layer decode ms (time_stage's keys) of a first stage `body` of `layers` layers: its step
    divided by them, each step behind `sweep` (the untimed layers' bytes, `_sweep`)."""
    return {k: v / layers for k, v in time_stage(body, batch, set_threads, between=sweep, spreads=spreads).items()}


def prefill_layers(ms_per_token_per_layer: float, chunk: int, most: int) -> int:
    """How many layers `time_prefill` may time within PREFILL_BUDGET_S (its two rounds each prefill a
    chunk, fill FAR_CONTEXT and prefill the chunk again), from one layer's cost per token; at least 1."""
    tokens = 2 * (2 * chunk + max(0, FAR_CONTEXT - chunk))
    per_layer_s = ms_per_token_per_layer * tokens / 1000
    return max(1, min(most, int(PREFILL_BUDGET_S / per_layer_s))) if per_layer_s > 0 else most


def _prefill_ms_per_token(layer: Any) -> float:
    """One layer's ms per prefill token at context 0, from a 256-token chunk (the second of two)."""
    import mlx.core as mx

    ids = mx.zeros((1, 256), mx.int32) + 11
    ms = 0.0
    for _ in range(2):
        cache = layer.make_cache()
        t0 = time.perf_counter()
        mx.eval(layer.forward(ids, cache), [e.state for e in cache])
        ms = (time.perf_counter() - t0) * 1000 / 256
    return ms


def time_prefill(model: Any, chunk: int, set_threads: Callable[[bool], None]) -> tuple[float, float]:
    """(ms per token at context 0, extra ms per token per 1000 cached tokens) for the stage."""
    import mlx.core as mx

    set_threads(True)  # a lone prompt's chunks run SOLO (engine/coordinator/pipeline.py), so all cores

    def tokens(n: int) -> mx.array:
        return mx.zeros((1, n), mx.int32) + 11 if model.first else \
            mx.random.normal((1, n, model.info.hidden_size)).astype(model.dtype)

    ids = tokens(chunk)

    def timed(cache: list[Any]) -> float:
        t0 = time.perf_counter()
        mx.eval(model.forward(ids, cache), [e.state for e in cache])
        return (time.perf_counter() - t0) * 1000 / chunk

    warm = model.make_cache()
    mx.eval(model.forward(tokens(64), warm), [e.state for e in warm])  # kernels, buffers
    near, far = [], []
    for _ in range(2):  # min of two each: a load spike only ever adds
        cache = model.make_cache()
        near.append(timed(cache))  # at context 0 ...
        if chunk < FAR_CONTEXT:
            mx.eval(model.forward(tokens(FAR_CONTEXT - chunk), cache), [e.state for e in cache])
        far.append(timed(cache))  # ... and behind FAR_CONTEXT cached tokens
    # every token of a chunk is scored against all keys so far: chunk, then max(chunk, FAR_CONTEXT) + chunk
    gap = max(chunk, FAR_CONTEXT) / 1000
    per_k = max(0.0, (min(far) - min(near)) / gap)
    # Extrapolating to no keys at all can reach zero when timing noise inflates per_k (a tiny
    # model on a loaded machine); a token's own cost is never below a tenth of what was measured.
    return max(min(near) / 10, min(near) - per_k * chunk / 1000), per_k


def body_plan(model_dir: Path, n: int, max_layers: int, cuts: dict[int, str], every: bool) -> tuple[int, int]:
    """(layers of the body to time, bytes of the body's layers that serving reads and the timing
    does not): a few that stand for all (families/layer_kinds.timed_layers), or all of them
    (`every`, or weights whose headers cannot be read: nothing says which layers are alike)."""
    from orchestrator.engine.stage.shard import read_config

    try:
        tensors = layer_kinds.tensor_headers(model_dir)
    except (OSError, ValueError, KeyError, struct.error):
        tensors = {}
    if every or not tensors:
        return allowed_cut(min(n - 1, max_layers), cuts), 0
    kinds = layer_kinds.layer_kinds(tensors, read_config(model_dir), n)[:n - 1]
    timed = layer_kinds.timed_layers(kinds, max_layers, cuts)
    return timed, sum(layer_kinds.layer_bytes(tensors, n - 1)[timed:])


def profile(model_dir: Path, batch: int, chunk: int, max_layers: int, every: bool = False) -> dict[str, Any]:
    """The ComputeProfile fields for `model_dir` on this machine (`every`: time every layer of
    the body, not the few that stand for them)."""
    from orchestrator.engine import blas

    base = settings.STAGE_THREADS.read()
    solo = settings.SOLO_THREADS.read()
    which = blas.preload(base or None, solo or None)  # before mlx is imported
    from orchestrator.engine.profiling.step import step_overheads
    from orchestrator.engine.stage.shard import ModelInfo, StageModel, read_config

    def set_threads(is_solo: bool) -> None:
        if which == "openblas" and base and solo:
            blas.set_threads(solo if is_solo else base)

    n = ModelInfo.read(model_dir).num_layers
    # A stage may not start or end where the family refuses a cut (Gemma 4's and AFM's KV-shared
    # layers stay with their source): the body and the tail end and begin where a split may.
    cuts = support.shared_kv_cuts(read_config(model_dir))
    body_layers, untimed_bytes = body_plan(model_dir, n, max_layers, cuts, every)
    per_layer: dict[str, float] = {}
    spreads: dict[str, float] = {}
    prefill = (0.0, 0.0)
    sweep = None
    if body_layers:
        body = StageModel(model_dir, 0, body_layers)
        reads = _sweep(min(untimed_bytes, sweep_limit()))
        per_layer = time_body(body, body_layers, batch, set_threads, reads, spreads)
        sweep = _decode_step(body, reads)
        one_layer = _prefill_ms_per_token(StageModel(model_dir, 0, 1))
        few = allowed_cut(prefill_layers(one_layer, chunk, min(body_layers, PREFILL_LAYERS)), cuts)
        a, b = time_prefill(StageModel(model_dir, 0, few), chunk, set_threads)
        prefill = (a / few, b / few)
    tail_start = allowed_cut(n - 1, cuts)
    tail = StageModel(model_dir, tail_start, n)
    # The last layer and the head alone fit in a large cache (a 127 MB tail on a 480 MiB L3)
    # and, timed back to back, stay there: 21-24 ms a step on 1 thread, against 31-32 ms with
    # the other layers' step in between, which is what serving does: a last stage runs its
    # own layers before the head, and stages sharing a machine run the others' in between.
    tail_ms = time_stage(tail, batch, set_threads, between=sweep, spreads=None if per_layer else spreads)
    sweep = body = reads = None  # the body's weights and the scratch go
    tail_layers = n - tail_start
    if not per_layer:  # one layer, or no cut allowed: the head cannot be told apart
        per_layer, tail_ms = {k: v / tail_layers for k, v in tail_ms.items()}, {k: 0.0 for k in tail_ms}
        a, b = time_prefill(tail, chunk, set_threads)
        prefill = (a / tail_layers, b / tail_layers)
    head = {k: max(0.0, tail_ms[k] - tail_layers * per_layer[k]) for k in tail_ms}
    set_threads(False)  # the stage's own path runs between steps of any kind; Python, mostly
    paths = step_overheads(ModelInfo.read(model_dir), tail.dtype, batch)
    mid = [r for r in MID_ROWS if f"b{r}" in per_layer]
    return {**paths, "layer_ms_rows": [(r, per_layer[f"b{r}"]) for r in mid],
            "head_ms_rows": [(r, head[f"b{r}"]) for r in mid], "batch": batch,
            "layer_ms_b1_solo": per_layer["b1_solo"], "layer_ms_b1": per_layer["b1"],
            "layer_ms_bB": per_layer["bB"], "head_ms_b1_solo": head["b1_solo"], "head_ms_b1": head["b1"],
            "head_ms_bB": head["bB"], "prefill_ms_per_token": prefill[0], "prefill_ms_per_token_per_k": prefill[1],
            "threads": [base, solo], "spread": round(max(spreads.values(), default=0.0), 3), "at": time.time(),
            "layers_timed": body_layers or tail_layers}


def allowed_cut(layers: int, cuts: dict[int, str]) -> int:
    """The most layers, at most `layers`, that a first stage may end after (a boundary the family
    allows, support.shared_kv_cuts); 0 when none is allowed."""
    return next((b for b in range(layers, 0, -1) if b not in cuts), 0)


def main(argv: list[str] | None = None) -> int:
    """Time the model's layers and write the profile as JSON; returns the exit status."""
    settings.exit_on_bad_settings(program="profile")
    parser = argparse.ArgumentParser(prog="python -m orchestrator.engine.profiling.layers",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prefill-chunk", type=int, default=2048,
                        help="tokens per timed prefill chunk (the engine's prefill_step_size)")
    parser.add_argument("--max-layers", type=int, default=64, help="time at most this many layers (the rest alike)")
    parser.add_argument("--all-layers", action="store_true",
                        help="time every layer of the body, not the few that stand for them")
    args = parser.parse_args(argv)
    try:
        result = profile(args.model, args.batch, args.prefill_chunk, args.max_layers, args.all_layers)
    except Exception as exc:  # noqa: BLE001 (the agent reports the reason)
        print(f"profile failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    args.out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
