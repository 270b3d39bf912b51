"""Test helpers for the engine: the mlx-lm reference, an in-test coordinator, and the comparison.

The reference is `mlx_lm.generate.generate_step` in this process, on the same BLAS as the
stage processes (see conftest). `assert_same` is the one comparison every exactness test
uses; `test_exactness.py` proves it fails for deliberately broken splits.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import mlx.core as mx
import numpy as np

from orchestrator import logs
from orchestrator.engine.config import load_config
from orchestrator.engine.coordinator.pipeline import Failed, Finished, GenerationParams, Pipeline, TokenEvent
from orchestrator.engine.local_pipeline import LocalPipeline
from orchestrator.engine.stage.shard import ModelInfo, StageModel
from orchestrator.families import support
from orchestrator.proc import WaitTimeout, wait_until

TOP = 5


@dataclass
class Trace:
    """Greedy generation: token ids, each token's log-prob and the top-5 (id, log-prob) pairs."""

    tokens: list[int]
    logprobs: list[float]
    top: list[list[tuple[int, float]]]


def _trace_from_vectors(pairs: list[tuple[int, mx.array]]) -> Trace:
    tokens, lps, tops = [], [], []
    for token, vec in pairs:
        vec = vec.reshape(-1)
        ids = mx.argsort(-vec)[:TOP].tolist()
        tokens.append(token)
        lps.append(vec[token].item())
        tops.append([(i, vec[i].item()) for i in ids])
    return Trace(tokens, lps, tops)


def reference(model_dir: Path, prompt: list[int], max_tokens: int, prefill_step: int = 2048) -> Trace:
    """Single-process mlx-lm greedy generation (the ground truth)."""
    from mlx_lm.generate import generate_step
    from mlx_lm.utils import load_model

    model, _ = load_model(Path(model_dir))
    steps = generate_step(mx.array(prompt), model, max_tokens=max_tokens, prefill_step_size=prefill_step)
    return _trace_from_vectors([(tok, lp) for tok, lp in steps])


def two_stages(model_dir: Path) -> list[StageModel]:
    """A model in two in-process stages, cut at the middle or the nearest earlier boundary the family
    allows (Gemma 4 keeps its K/V-sharing layers with their sources)."""
    config = json.loads((model_dir / "config.json").read_text())
    n = ModelInfo.read(model_dir).num_layers
    refused = support.shared_kv_cuts(config)
    cut = max(c for c in range(1, n // 2 + 1) if c not in refused)
    return [StageModel(model_dir, 0, cut), StageModel(model_dir, cut, n)]


def split_in_process(stages: list[StageModel], prompt: list[int], max_tokens: int, prefill_step: int = 2048) -> Trace:
    """The pipeline's arithmetic without processes: used to show the comparison bites."""
    caches = [s.make_cache() for s in stages]

    def through(x: mx.array) -> mx.array:
        for s, c in zip(stages, caches):
            # what crosses the wire must be what the next stage takes (its frames are checked)
            assert s.first or x.dtype == s.dtype, f"stage {s.layer_range} takes {s.dtype}, got {x.dtype}"
            x = s.forward(x, c)
        return x

    for start in range(0, len(prompt) - 1, prefill_step):
        through(mx.array(prompt[start:min(start + prefill_step, len(prompt) - 1)])[None])
        mx.eval([c.state for cache in caches for c in cache])
    out, token = [], prompt[-1]
    for _ in range(max_tokens):
        lp = stages[-1].logprobs(through(mx.array([token])[None]))
        token = int(mx.argmax(lp, axis=-1).item())
        out.append((token, lp))
    return _trace_from_vectors(out)


def assert_same(expected: Trace, got: Trace) -> None:
    """Tokens identical and float32 log-probs bit-identical, position by position."""
    assert got.tokens == expected.tokens, f"tokens differ:\n ref {expected.tokens}\n got {got.tokens}"
    for i, (a, b) in enumerate(zip(expected.logprobs, got.logprobs)):
        assert np.float32(a).tobytes() == np.float32(b).tobytes(), f"log-prob of token {i} differs: {a!r} vs {b!r}"
    assert got.top == expected.top, "top-5 log-probs differ"


class InTestCoordinator:
    """A Pipeline in the test process driving real stage processes (token ids, not text)."""

    def __init__(self, cluster: LocalPipeline, eos: set[int] | None = None, context: int = 2048) -> None:
        config = load_config(cluster.config_path)
        self.pipeline = Pipeline(config, cluster.secret.encode(), eos or set(), context, logs.get("test-coordinator"))
        self.pipeline.start()

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Block until the probe generation went through every stage."""
        try:
            wait_until(lambda: self.pipeline.health.ready, timeout, 0.02, "the pipeline to be ready")
        except WaitTimeout as exc:
            raise AssertionError(f"{exc}: {self.pipeline.health}") from None

    def metric(self, name: str) -> float:
        """One unlabelled counter or gauge of the coordinator's /metrics text."""
        return next(float(line.split()[1]) for line in self.pipeline.metrics.render().splitlines()
                    if line.split()[:1] == [name])

    def stage_stats(self, ready: Callable[[list[dict]], bool], timeout: float = 10.0) -> list[dict]:
        """Per-stage figures from the stages' PONGs, once `ready(stats)` holds (they arrive every 0.5 s)."""
        def stats() -> list[dict] | None:
            got = [dict(s.stats) for s in self.pipeline.health.stages]
            return got if ready(got) else None

        return wait_until(stats, timeout, 0.05, "per-stage figures from the stages' PONGs")

    def generate(self, prompt: list[int], max_tokens: int, **params: object):
        """Submit and return the Generation handle."""
        return self.pipeline.submit(prompt, GenerationParams(max_tokens=max_tokens, top_logprobs=TOP, **params))

    @staticmethod
    def collect(gen, timeout: float = 60.0) -> Trace:
        """Read a generation to the end; raises on failure."""
        tokens, lps, tops = [], [], []
        while True:
            ev = gen.events.get(timeout=timeout)
            if isinstance(ev, TokenEvent):
                tokens.append(ev.token)
                lps.append(ev.logprob)
                tops.append([tuple(p) for p in ev.top])
            elif isinstance(ev, Finished):
                return Trace(tokens, lps, tops)
            else:
                assert isinstance(ev, Failed)
                raise RuntimeError(ev.message)

    def run(self, prompt: list[int], max_tokens: int) -> Trace:
        """Generate greedily and collect."""
        return self.collect(self.generate(prompt, max_tokens))

    def stop(self) -> None:
        """Stop the in-test scheduler, and wait for it (it logs its last state change)."""
        self.pipeline.stop(wait_s=10)
