"""The planner's memory estimate against what real stages hold, for every family test model.

For each family of orchestrator/testmodels/families.py, in float32, 4-bit and mixed 4/6/8-bit, the model is split
in two in the middle; each stage is loaded with the engine's own StageModel (the family's
mlx-lm code) and a request of CONTEXT tokens is run through both stages (a prefill of
CONTEXT - 1 tokens, then one decode step, as generation does). The plan's weights + KV cache
for that stage at that context must be within 15 % of the stage's parameter bytes plus the
bytes of its caches (the family's own caches; skipped layers' are zero-width).

Run with `-s` to see the table (docs/families.md, "Memory estimates per family").
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx

from orchestrator.engine.stage.shard import StageModel
from orchestrator.models.describe import describe_model
from orchestrator.planner import Plan, PlanSettings, plan_cluster
from orchestrator.testmodels.families import FAMILIES, build_family_model
from tests.support import matrix
from tests.support.builders import GB, facts_for

CONTEXT = 300  # past one 256-token cache step and far past the 8-token sliding windows
TOLERANCE = 0.15
QUANTS = (None, "q4", "mixed")  # mixed: per-module bit widths and group sizes


def measure(model_dir: Path, split: tuple[tuple[int, int], ...]) -> list[int]:
    """Parameter bytes + cache bytes of each stage after a CONTEXT-token request."""
    stages = [StageModel(model_dir, first, last + 1) for first, last in split]
    caches = [s.make_cache() for s in stages]
    for tokens in ([5 + i % 500 for i in range(CONTEXT - 1)], [7]):
        x = mx.array([tokens])
        for stage, cache in zip(stages, caches):
            x = stage.forward(x, cache)
            mx.eval(x)
    return [s.weight_bytes + sum(c.nbytes for c in cache) for s, cache in zip(stages, caches)]


def estimate(model_dir: Path, split: tuple[tuple[int, int], ...], *, uniform_kv: bool = False) -> list[int]:
    """The plan's weights + KV cache of each stage at CONTEXT tokens, one sequence.

    `uniform_kv` drops the per-layer caches, as a description from an older agent has none:
    the planner then counts standard attention in every layer (the comparison column).
    """
    model = describe_model(model_dir)
    if uniform_kv:
        model = model.model_copy(update={"layer_caches": ()})
    settings = PlanSettings(context_length=CONTEXT, max_concurrent_sequences=1, manual_split=split)
    plan = plan_cluster(model, facts_for(8 * GB, 8 * GB), settings)
    assert isinstance(plan, Plan), plan
    return [s.weight_bytes + s.kv_cache_bytes for s in plan.stages]


def worst_error(estimated: list[int], measured: list[int]) -> float:
    """The largest relative error over the stages."""
    return max(abs(e - m) / m for e, m in zip(estimated, measured))


def test_plan_matches_measured_stage_memory(tmp_path: Path) -> None:
    rows, bad = [], []
    # every family in one format, representative ones in all (`make test-matrix`: every pair)
    for family, quant in matrix.rows(sorted(FAMILIES), QUANTS, every=("llama", "qwen3_moe", "gemma4_text")):
        spec = FAMILIES[family]
        if quant is not None and quant not in spec.quants:  # afm7: float only (mlx-lm cannot quantize it)
            continue
        half = len(spec.layers) // 2
        model_dir = build_family_model(tmp_path / f"{family}-{quant}", family, quant=quant)
        refused = describe_model(model_dir).refused_boundaries
        cut = max(b for b in range(1, half + 1) if b not in refused)  # Gemma 4: not between KV-shared layers
        split = ((0, cut - 1), (cut, len(spec.layers) - 1))
        est, meas = estimate(model_dir, split), measure(model_dir, split)
        error = worst_error(est, meas)
        rows.append((family, quant or "float32", sum(est), sum(meas), error,
                     worst_error(estimate(model_dir, split, uniform_kv=True), meas)))
        if error > TOLERANCE:
            bad.append(f"{family} {quant}: per stage estimated {est}, measured {meas}")
    if matrix.full():  # docs/families.md's table needs every format of every family
        print(f"\nContext {CONTEXT} tokens, one sequence, 2 stages; bytes of both stages together.\n")
        print(readme_table(rows))
    assert not bad, bad


def readme_table(rows: list[tuple[str, str, int, int, float, float]]) -> str:
    """docs/families.md's "Memory estimates per family" table: one row per family, estimated /
    measured bytes per weight format, the worst stage error and the uniform-KV estimate's
    worst error over the formats."""
    lines = ["| family | float32: estimated / measured | q4 | mixed | worst stage error | uniform-KV error (worst) |",
             "|---|---:|---:|---:|---:|---:|"]
    for family in sorted({r[0] for r in rows}):
        mine = [r for r in rows if r[0] == family]
        cells = " | ".join(f"{est:,} / {meas:,}" for _, _, est, meas, _, _ in mine)
        error, uniform = max(r[4] for r in mine), max(r[5] for r in mine)
        lines.append(f"| {family} | {cells} | {100 * error:.1f} % | {100 * uniform:.1f} % |")
    return "\n".join(lines)
