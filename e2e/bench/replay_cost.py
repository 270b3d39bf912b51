"""What a rollback by replay costs beside a rollback by trim, side by side on the demo model.

Usage: PYTHONPATH=. .venv/bin/python -m e2e.bench.replay_cost [--model smollm2] [--draft 4] [--rounds 25]

Families whose caches cannot trim (recurrent states, sliding windows, chunked attention) roll a
verification chunk back through a rewind point and run the accepted positions again in front of the
next input (engine/stage/rewind.py). No such model can be had here with real weights, so this forces the
replay on the demo model's plain KV caches, whose trim is the baseline: the same stage (the whole model,
every core's BLAS threads, as a lone request's SOLO steps run), the same pass (1 + `--draft` tokens after a
150-token context, a accepted), then the next step — both ways, interleaved round by round. A pass's cost
is its verification chunk plus what its rollback adds to the next step; the speed-up is the tokens it
yields (a + 1) × a plain step ÷ that cost, the hops left out. Prints a Markdown table (docs/benchmark.md).
"""

from __future__ import annotations

import os
import statistics
import sys
import time

from e2e.bench.procs import model_parser
from orchestrator.engine import blas

CORES = os.cpu_count() or 1
CONTEXT = 150


def main(argv: list[str] | None = None) -> int:
    """Measure both rollbacks and print the table."""
    p = model_parser(__doc__)
    p.add_argument("--draft", type=int, default=4, help="drafted tokens per pass")
    p.add_argument("--rounds", type=int, default=25, help="timed passes per row and way, interleaved")
    args = p.parse_args(argv)
    blas.preload(CORES)  # before mlx is imported
    import mlx.core as mx

    from e2e.bench.procs import prepare_model, whole_model_stage
    from orchestrator.engine.stage.rewind import Rewind, Rollback

    stage = whole_model_stage(prepare_model(args.model))
    cache = stage.make_cache()
    mx.eval(stage.forward(mx.array([[(i * 37 + 11) % 5000 for i in range(CONTEXT)]]), cache))
    chunk = mx.array([list(range(100, 101 + args.draft))])

    def run(x: mx.array, position: int, rw: Rewind, verifying: bool) -> int:
        x, start = rw.prepare(cache, position, x, verifying, stage.forward)
        mx.eval(rw.forward(stage.forward, x, cache), [c.state for c in cache])
        rw.ran(position, verifying)
        return start + int(x.shape[1])

    def one_pass(accepted: int, replay: bool) -> tuple[float, float]:
        """(the verification chunk's seconds, the next step's), caches put back afterwards."""
        # the demo's caches trim: the replay is forced, to compare
        rw = Rewind(Rollback("replay" if replay else "trim"))
        started = time.perf_counter()
        position = run(chunk, CONTEXT, rw, True)
        verified = time.perf_counter()
        if accepted < args.draft:
            position = rw.back(cache, position, CONTEXT + accepted + 1)
        end = run(mx.array([[7]]), position, rw, False)
        done = time.perf_counter()
        for c in cache:
            c.trim(end - CONTEXT)
        return verified - started, done - verified

    def plain_step() -> float:
        started = time.perf_counter()
        mx.eval(stage.forward(mx.array([[7]]), cache), [c.state for c in cache])
        seconds = time.perf_counter() - started
        for c in cache:
            c.trim(1)
        return seconds

    rows = range(args.draft + 1)
    times: dict[tuple[int, bool], list[tuple[float, float]]] = {(a, r): [] for a in rows for r in (False, True)}
    plain: list[float] = []
    for _ in range(2):  # warm-up: the first chunks of each width compile and allocate
        for key in times:
            one_pass(*key)
    for _ in range(args.rounds):
        plain.append(plain_step())
        for key in times:
            times[key].append(one_pass(*key))
    step = statistics.median(plain)

    def cost(a: int, replay: bool) -> tuple[float, float]:
        """(the pass's cost in plain steps: its chunk + what it adds to the next step; that next step ÷ a plain one)."""
        verify = statistics.median(t for t, _ in times[a, replay])
        after = statistics.median(t for _, t in times[a, replay])
        return (verify + after - step) / step, after / step

    print(f"Rollback by trim and by replay on {args.model} (whole model, {CORES} BLAS threads, {CONTEXT}-token "
          f"context, passes of 1 + {args.draft} tokens, median of {args.rounds} interleaved rounds; a plain step "
          f"{step * 1e3:.1f} ms).\n")
    print("| drafts accepted | next step after trim | after replay | pass cost, trim | pass cost, replay "
          "| speed-up, trim | speed-up, replay | replay ÷ trim |")
    print("|---|---|---|---|---|---|---|---|")
    for a in rows:
        (trim, trim_next), (replay, replay_next) = cost(a, False), cost(a, True)
        print(f"| {a} of {args.draft} | {trim_next:.2f}× | {replay_next:.2f}× | {trim:.2f} | {replay:.2f} | "
              f"{(a + 1) / trim:.2f}× | {(a + 1) / replay:.2f}× | {trim / replay:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
