"""The path outside the layers, per process and step, on the demo model: what item 0 of the per-token work targets.

Usage: PYTHONPATH=. .venv/bin/python -m e2e.bench.paths [--model smollm2] [--batch 4] [--rounds 3]

`orchestrator/engine/profiling/step.py` times the real code of a stage (a real `Stage` around a stand-in
whose layers are one trivial op) and of the coordinator's scheduler, each from its input frames on its
socket to its output frames sent (its send returned): a stage passing hidden states on (what one stage
boundary adds to a token), the last stage (its sampler's log-softmax over the vocabulary included), and
the coordinator (RESULT in, the token event handed to its streaming thread, the next step's token ids
sent), also until that streaming thread has built and written its SSE chunk. One row after 20 ms asleep
(a lone request's step: the other stages computed meanwhile) and B rows back to back. Prints a Markdown
table (docs/benchmark.md, "The path outside the layers").
"""

from __future__ import annotations

from e2e.bench.procs import model_parser
from orchestrator.engine import blas


def main(argv: list[str] | None = None) -> int:
    """Time every path and print the table."""
    p = model_parser(__doc__)
    p.add_argument("--batch", type=int, default=4, help="rows of the back-to-back step (B)")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
