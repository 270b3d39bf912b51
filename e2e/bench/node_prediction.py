"""The plan's prediction beside `make bench`'s measurements (issue 41: "the plan's predicted figures
within ±20 % of these").

Before a model's systems start, its layers are timed as an agent times them
(`engine/profiling/layers.py`, the few layers that stand for all) in a process pinned to the first
emulated node's core with one BLAS thread, which is what each emulated node is; then
`planner/predict.py` predicts the 2-stage split on two such nodes (each stage its own machine) over
loopback, the coordinator beside stage 0. The figures compared are the ones the plan shows that the
bench also measures of pipeserve: decode at 1 request, the decode aggregate at 4 and 8 requests
(the bench's long answers), and the TTFT of its long prompt with the default cut and, as
`ttft_pipelined`, with the pipelined cut (PIPESERVE_PREFILL_CHUNKS=pipelined: chunks of
`prefill_plan.pipelined_step` tokens instead of 2048).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from e2e.bench.layer_timing import time_layers
from orchestrator import settings
from orchestrator.engine.config import ClusterSpec
from orchestrator.engine.coordinator.prefill_plan import pipelined_step
from orchestrator.models.describe import DTYPE_BYTES
from orchestrator.planner.perf_inputs import LOCAL_LINK
from orchestrator.planner.predict import StageSpec, predict, ttft_s

CONCURRENCY = (4, 8)
PREFILL_STEP = ClusterSpec.model_fields["prefill_step_size"].default  # the bench keeps the cluster default


@dataclass
class Prediction:
    """What the plan predicts for pipeserve's split: metric (as `nodes.METRICS` names it) -> figure."""

    figures: dict[str, float] = field(default_factory=dict)
    timing: str = ""  # what was timed, in words
    doubt: str = ""  # the busy-machine rule's doubt about the timing ('' when trusted)


def node_env() -> dict[str, str]:
    """One emulated node's setting: one BLAS thread (OpenBLAS) for every step, as the stages run."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", "OPENBLAS_NUM_THREADS": "1", settings.BLAS.name: "openblas",
            settings.STAGE_THREADS.name: "1", settings.SOLO_THREADS.name: "1"}


def hidden_bytes(model_dir: Path) -> int:
    """Bytes of one token's hidden state at a boundary."""
    cfg = json.loads((model_dir / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    return int(cfg["hidden_size"]) * DTYPE_BYTES.get(str(cfg.get("torch_dtype", "float32")), 4)


def predicted(model_dir: Path, splits: list[tuple[int, int]], core: int, ttft_tokens: int) -> Prediction:
    """Time the layers on `core` and predict the split (stage k on its own emulated node)."""
    t, doubt = time_layers(model_dir, node_env(), {core})
    stages = [StageSpec(label=f"stage {k}", node_name=f"node-{k}", layer_weight=hi - lo + 1,
                        last=k == len(splits) - 1, timing=t, machine=f"node-{k}")
              for k, (lo, hi) in enumerate(splits)]
    links, hidden = [LOCAL_LINK] * len(stages), hidden_bytes(model_dir)
    perf = predict(stages, links, hidden, requests=CONCURRENCY, prompts=(ttft_tokens,))
    cut = pipelined_step(ttft_tokens, len(stages), PREFILL_STEP)
    figures = {"decode1": perf.decode_tps_1, "ttft": perf.ttft_s[0].y,
               "ttft_pipelined": ttft_s(stages, links, hidden, ttft_tokens, cut)}
    figures.update({f"long{c}": perf.aggregate(c) for c in CONCURRENCY})
    timing = (f"{t.layer_ms_b1:.2f} ms a layer for 1 row, {t.layer_ms_bB:.2f} for {t.batch}; head "
              f"{t.head_ms_b1:.1f} ms; prefill {t.prefill_ms_per_token:.3f} ms a token a layer")
    return Prediction(figures, timing, doubt)
