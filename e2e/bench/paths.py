"""The path outside the layers on the demo model: per process in isolation, and traced in a running pipeline.

Usage: PYTHONPATH=. .venv/bin/python -m e2e.bench.paths [--model smollm2] [--batch 4] [--rounds 3]
       PYTHONPATH=. .venv/bin/python -m e2e.bench.paths --pipeline [--stages 2] [--tokens 200] [--rounds 2]

Without --pipeline: `orchestrator/engine/profiling/step.py` times the real code of a stage (a real
`Stage` around a stand-in whose layers are one trivial op) and of the coordinator's scheduler, each from
its input frames on its socket to its output frames sent (its send returned): a stage passing hidden
states on, the last stage (its sampler's log-softmax over the vocabulary included), and the coordinator
(RESULT in, the token event handed to its streaming thread, the next step's token ids sent), also until
that streaming thread has built and written its SSE chunk. One row after 20 ms asleep (a lone request's
step: the other stages computed meanwhile) and B rows back to back; on a VM whose cores sit idle that
long, waking them is most of it (docs/benchmark.md).

With --pipeline: the demo's pipeline itself (`LocalPipeline`, 1 BLAS thread per stage, every core for
a SOLO step) with PIPESERVE_STEP_TRACE set (orchestrator/engine/steptrace.py), one request of --tokens
greedy tokens; every process marks when its step's input was ready, its output evaluated and sent, on
the clock all of them share. A stage boundary is from the output of one stage evaluated to the input of
the next ready (framing, the send, the wake-up and read on the other side, the hand-off to its MLX thread,
the array); the coordinator's part from the last stage's output evaluated to stage 0's next input ready.
Prints a Markdown table of medians (and quartiles) per round.
"""

from __future__ import annotations

import os
import statistics
import tempfile
from pathlib import Path

from e2e.bench.procs import model_parser
from orchestrator.engine import blas


def isolated(args) -> None:
    """Time every process's path in isolation and print the table."""
    which = blas.preload(None, None)  # before mlx is imported: serving's BLAS
    import mlx.core as mx

    from e2e.bench.procs import prepare_model
    from orchestrator.engine.profiling.step import IDLE_S, STEPS, table
    from orchestrator.engine.stage.shard import ModelInfo, read_config

    model = prepare_model(args.model)
    info = ModelInfo.read(model)
    dtype = {"bfloat16": mx.bfloat16, "float16": mx.float16}.get(str(read_config(model).get("torch_dtype")), mx.float32)
    print(f"{args.model}: hidden {info.hidden_size}, vocabulary {info.vocab_size}, activations {dtype}, BLAS {which}; "
          f"ms per step, medians of {STEPS} steps; 1 row after {IDLE_S * 1000:.0f} ms asleep, "
          f"{args.batch} back to back")
    print("\n".join(table(info, dtype, args.batch, args.rounds)))


def spans(marks: list[tuple[float, str, str]], start: tuple[str, str], end: tuple[str, str],
          longest_ms: float = 20.0) -> list[float]:
    """Milliseconds from each `start` (process, event) mark to the first `end` mark after it (before
    the next `start`): one per step of a lone request; longer than `longest_ms` is not one step's
    (the end of a request, the next one's prefill)."""
    if start == end:
        times = [t for t, who, event in marks if (who, event) == start]
        return [(b - a) * 1000 for a, b in zip(times, times[1:]) if (b - a) * 1000 <= longest_ms]
    out, began = [], None
    for t, who, event in marks:
        if (who, event) == start:
            began = t
        elif (who, event) == end and began is not None:
            if (t - began) * 1000 <= longest_ms:
                out.append((t - began) * 1000)
            began = None
    return out


def rows_of(marks: list[tuple[float, str, str]], stages: int) -> list[tuple[str, list[float]]]:
    """The table's rows: each stage's compute, each boundary, the coordinator's part, the token interval."""
    last = f"stage-{stages - 1}"
    rows = [(f"stage {k}: input ready → output evaluated (its layers)",
             spans(marks, (f"stage-{k}", "input"), (f"stage-{k}", "evaluated"), 1000)) for k in range(stages)]
    for k in range(stages - 1):
        sender, receiver = f"stage-{k}", f"stage-{k + 1}"
        rows += [(f"boundary {k} → {k + 1}: evaluated → next stage's input ready",
                  spans(marks, (sender, "evaluated"), (receiver, "input"))),
                 (f"  of which stage {k}: evaluated → sent", spans(marks, (sender, "evaluated"), (sender, "sent"))),
                 (f"  of which evaluated → stage {k + 1}'s reader has the frames",
                  spans(marks, (sender, "evaluated"), (receiver, "read"))),
                 (f"  of which stage {k + 1}: read → input ready (the hand-off to its MLX thread, the array)",
                  spans(marks, (receiver, "read"), (receiver, "input")))]
    rows += [("last stage: evaluated → its RESULT sent", spans(marks, (last, "evaluated"), (last, "sent"))),
             ("RESULT sent → coordinator has it", spans(marks, (last, "sent"), ("coordinator", "results"))),
             ("coordinator: RESULT → next step sent",
              spans(marks, ("coordinator", "results"), ("coordinator", "sent"))),
             ("next step sent → stage 0's input ready", spans(marks, ("coordinator", "sent"), ("stage-0", "input"))),
             ("token interval (stage 0's input to its next)",
              spans(marks, ("stage-0", "input"), ("stage-0", "input"), 1000))]
    return rows


def traced(args) -> None:
    """Run the demo's pipeline with the step trace on, one request at a time, and print the table."""
    import requests

    from e2e.bench.procs import prepare_model
    from orchestrator import settings
    from orchestrator.engine.local_pipeline import LocalPipeline, compute_split
    from orchestrator.engine.stage.shard import read_config
    from orchestrator.engine.steptrace import read

    model = prepare_model(args.model)
    splits = compute_split(read_config(model), args.stages)
    with tempfile.TemporaryDirectory(prefix="paths-") as tmp:
        trace = Path(tmp) / "steps.trace"
        lp = LocalPipeline(Path(tmp) / "pipeline", model, splits, threads=1, solo_threads=os.cpu_count() or 1,
                           env={settings.STEP_TRACE.name: str(trace)}, model_name="bench").start()
        try:
            body = {"model": "bench", "prompt": list(range(1, 33)), "max_tokens": args.tokens, "temperature": 0}
            results = []
            for _ in range(args.rounds):
                trace.write_text("")
                requests.post(lp.base_url + "/v1/completions", json=body, timeout=600).raise_for_status()
                requests.post(lp.base_url + "/v1/completions", json={**body, "max_tokens": 1},
                              timeout=600).raise_for_status()  # a few more steps: every process flushes its marks
                results.append(rows_of(read(trace), args.stages))
        finally:
            lp.stop()
    print(f"{args.model}, {args.stages} stages (layers {', '.join(f'{a}-{b}' for a, b in splits)}), 1 BLAS thread per "
          f"stage, every core when SOLO; one request of {args.tokens} tokens per round; ms, median (quartiles)")
    print("| span | " + " | ".join(f"round {r + 1}" for r in range(args.rounds)) + " |")
    print("|---|" + "---|" * args.rounds)
    for i, (name, _) in enumerate(results[0]):
        cells = []
        for rows in results:
            values = rows[i][1]
            if len(values) < 4:
                cells.append("–")
                continue
            q = statistics.quantiles(values, n=4)
            cells.append(f"{statistics.median(values):.3f} ({q[0]:.3f}–{q[2]:.3f})")
        print(f"| {name} | " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> int:
    """Time the paths and print the table."""
    p = model_parser(__doc__)
    p.add_argument("--batch", type=int, default=4, help="rows of the back-to-back step (B), in isolation")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--pipeline", action="store_true", help="trace the demo's running pipeline instead")
    p.add_argument("--stages", type=int, default=2, help="with --pipeline: stages of the split")
    p.add_argument("--tokens", type=int, default=200, help="with --pipeline: tokens of each round's request")
    args = p.parse_args(argv)
    traced(args) if args.pipeline else isolated(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
