"""Batched decode vs solo decode, bit for bit, for a list of families (run as a subprocess).

`python -m tests.support.batch_check DIR FAMILY...` builds each family's test model under DIR,
prefills three requests of different lengths (longer than the sliding windows) on a
two-stage split, then runs decode steps both one request at a time and as one micro-batch,
and prints one JSON line per family: {family, exact, batched, refusal}.

It runs in its own process so the test can choose the BLAS: under OpenBLAS a GEMM row can
depend on how many rows share the call (a different kernel for one row), which is a
property of the BLAS, not of the split; under the reference BLAS it cannot.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

PROMPTS = [[(i * 37 + 11) % 500 for i in range(n)] for n in (20, 5, 11)]
STEPS = 6


def check(model_dir: Path, layers: int) -> dict[str, object]:
    """Decode STEPS tokens for three requests, solo and batched; compare every log-prob vector."""
    import mlx.core as mx

    from orchestrator.engine.stage.shard import StageModel, read_config
    from orchestrator.families import support

    cut, refused = layers // 2, support.shared_kv_cuts(read_config(model_dir))
    while cut in refused:  # a boundary between KV-shared layers and their sources is refused: cut earlier
        cut -= 1
    stages = [StageModel(model_dir, 0, cut), StageModel(model_dir, cut, layers)]

    def through(x, caches, batch=False):
        for stage, c in zip(stages, caches):
            x = stage.forward_batch(x, c) if batch else stage.forward(x, c)
        return x

    solo = [[s.make_cache() for s in stages] for _ in PROMPTS]
    rows = [[s.make_cache() for s in stages] for _ in PROMPTS]
    for prompt, a, b in zip(PROMPTS, solo, rows):
        for caches in (a, b):
            through(mx.array(prompt)[None], caches)
            mx.eval([c.state for cache in caches for c in cache])
    tokens, exact = [1, 2, 3], True
    for _ in range(STEPS):
        singles = [stages[-1].logprobs(through(mx.array([t])[None], c)) for t, c in zip(tokens, solo)]
        per_stage = [[r[i] for r in rows] for i in range(len(stages))]
        batched = through([mx.array([t])[None] for t in tokens], per_stage, batch=True)
        exact &= all(mx.array_equal(a, stages[-1].logprobs(b)).item() for a, b in zip(singles, batched))
        tokens = [int(mx.argmax(x).item()) for x in singles]
    return {"exact": bool(exact), "batched": all(s.batchable for s in stages),
            "refusal": next((s.batch_refusal for s in stages if s.batch_refusal), None)}


def main(argv: list[str]) -> int:
    """Build and check each family named on the command line; one JSON line each."""
    from orchestrator.engine import blas

    blas.preload()
    from orchestrator.testmodels.families import FAMILIES, build_family_model

    root = Path(argv[0])
    for family in argv[1:]:
        model_dir = build_family_model(root / family, family, overwrite=True)
        result = check(model_dir, len(FAMILIES[family].layers))
        print(json.dumps({"family": family, "blas": blas.active(), **result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
