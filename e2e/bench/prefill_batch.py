"""Would batching the prefills of concurrent requests pay on this CPU? Time and bits, side by side.

Usage: PYTHONPATH=. .venv/bin/python -m e2e.bench.prefill_batch [--model smollm2] [--requests 4]
       [--tokens 149] [--rounds 3]

Four requests that arrive together each prefill their prompt on stage 0, one after another (a chunk is
one request's FORWARD). This measures, on the whole model in one process, what one batch of those
prompts would cost instead: the prompts one at a time (`StageModel.forward`, what a stage runs), as
one batch the stage's way (`StageModel.forward_batch`: projections and MLP batched, attention row by
row against each request's own cache, engine/stage/batch.py), and as one [B, L] tensor through
mlx-lm's model (what a batching server runs; equal-length prompts, so no padding). For each, at 1 and
at every core's BLAS threads: the best round's seconds and whether every output and every cached key
is bit-identical to the one-at-a-time run. Prints a Markdown table (docs/benchmark.md).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from orchestrator.engine import blas

CORES = os.cpu_count() or 1


def main(argv: list[str] | None = None) -> int:
    """Measure and print the table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--requests", type=int, default=4)
    p.add_argument("--tokens", type=int, default=149, help="prompt tokens per request (the code edit's 149)")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    which = blas.preload()  # before mlx is imported
    import mlx.core as mx

    from e2e.bench.procs import prepare_model
    from orchestrator.engine.stage.batch import install_row_attention
    from orchestrator.engine.stage.shard import StageModel, read_config

    model_dir = prepare_model(args.model)
    layers = int(read_config(model_dir)["num_hidden_layers"])
    stage = StageModel(model_dir, 0, layers)
    install_row_attention()
    vocab = stage.info.vocab_size
    prompts = [mx.array([[(7919 * b + 104729 * i) % (vocab - 200) + 100 for i in range(args.tokens)]])
               for b in range(args.requests)]

    def evaluated(outs: list, caches: list) -> tuple[list, list]:
        mx.eval(outs, [c.state for cache in caches for c in cache])
        return outs, caches

    def one_at_a_time() -> tuple[list, list]:
        caches = [stage.make_cache() for _ in prompts]
        return evaluated([stage.forward(x, c) for x, c in zip(prompts, caches)], caches)

    def stage_batch() -> tuple[list, list]:
        caches = [stage.make_cache() for _ in prompts]
        return evaluated(stage.forward_batch(prompts, caches), caches)

    def tensor_batch() -> tuple[list, list]:
        cache = stage.make_cache()
        out = stage.forward(mx.concatenate(prompts, axis=0), cache)
        return evaluated([out[b:b + 1] for b in range(len(prompts))], [cache])

    def same(a: tuple[list, list], b: tuple[list, list]) -> bool:
        outs = all(mx.array_equal(x, y).item() for x, y in zip(a[0], b[0]))
        if len(b[1]) != len(a[1]):  # one batch cache: compare each request's row of its keys
            keys = all(mx.array_equal(c.state[0], bc.state[0][r:r + 1]).item()
                       for r, cache in enumerate(a[1]) for c, bc in zip(cache, b[1][0]))
        else:
            keys = all(mx.array_equal(c.state[0], d.state[0]).item() for x, y in zip(a[1], b[1]) for c, d in zip(x, y))
        return outs and keys

    ways = {"one at a time (what a stage runs now)": one_at_a_time,
            "one batch, the stage's way (attention by row)": stage_batch,
            "one [B, L] tensor through mlx-lm's model": tensor_batch}
    rows = []
    for threads in sorted({1, CORES}):
        blas.set_threads(threads)
        base = one_at_a_time()  # also the warm-up
        for name, way in ways.items():
            best, result = float("inf"), None
            for _ in range(args.rounds):
                t0 = time.perf_counter()
                result = way()
                best = min(best, time.perf_counter() - t0)
            rows.append((threads, name, best, same(base, result)))
            print(f"  {threads} thread(s) {name}: {best:.3f} s", file=sys.stderr)
    print(f"\n{args.requests} prompts of {args.tokens} tokens, {args.model}, whole model in one process, "
          f"{which} BLAS, best of {args.rounds} rounds\n")
    print("| BLAS threads | prefill of the prompts | seconds | ÷ one at a time | bit-identical to one at a time |")
    print("|---|---|---|---|---|")
    for threads, name, seconds, identical in rows:
        alone = next(s for t, n, s, _ in rows if t == threads and n.startswith("one at a time"))
        print(f"| {threads} | {name} | {seconds:.3f} | {seconds / alone:.2f} | {'yes' if identical else 'no'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
