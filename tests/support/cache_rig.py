"""The prompt cache's arithmetic without processes: the coordinator's index and each stage's entries.

`CachedRig` drives a list of stages (a split's `StageModel`s, or `whole(model_dir)`: the full
mlx-lm model in one process) through turns the way the pipeline does: the index plans the
reuse, each stage starts from a copy of its entry trimmed with the caches' own `trim`, the
rest of the prompt is prefilled in the same chunks, decode is greedy, and the finished
request's cache is stored as an entry. With `whole(...)` it is mlx-lm's own prompt-cache path
(mlx_lm.server: fetch the nearest cache, trim, prefill the rest) — the reference a split must
equal bit for bit; the tokens must also equal a cold run's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx

from orchestrator.engine.coordinator.prefix_index import PrefixIndex, Reuse, prefill_chunks
from orchestrator.engine.stage.prompt_cache import StageCache
from tests.support.engine_harness import Trace, _trace_from_vectors


@dataclass
class Whole:
    """The whole mlx-lm model as one 'stage' (the reference)."""

    model: Any
    first: bool = True
    last: bool = True

    def make_cache(self) -> list[Any]:
        from mlx_lm.models.cache import make_prompt_cache

        return make_prompt_cache(self.model)

    def forward(self, x: mx.array, cache: list[Any]) -> mx.array:
        return self.model(x, cache=cache)

    def logprobs(self, logits: mx.array) -> mx.array:
        last = logits[:, -1, :]
        return last - mx.logsumexp(last, keepdims=True)


def whole(model_dir: Path) -> list[Whole]:
    """The single-process reference as a one-stage list."""
    from mlx_lm.utils import load_model

    model, _ = load_model(Path(model_dir))
    return [Whole(model)]


class CachedRig:
    """Turns through `stages` with one prefix index and one entry store per stage."""

    def __init__(self, stages: list[Any], prefill_step: int, budget: int = 1 << 30, faults: list | None = None) -> None:
        self.stages = stages
        self.step = prefill_step
        self.index = PrefixIndex(len(stages), budget)
        self.stores = [StageCache(f) for f in (faults or [None] * len(stages))]

    def run(self, prompt: list[int], max_tokens: int, checkpoints: tuple[int, ...] = ()) -> tuple[Trace, Reuse | None]:
        """One greedy request; `checkpoints` are stored whatever the index knows. Returns the trace
        and the reuse the index planned."""
        reuse = self.index.plan(prompt)
        if reuse is not None:
            self.index.used(reuse)
            caches = [st.start({"from": reuse.entry, "keep": reuse.keep})[0] for st in self.stores]
        else:
            caches = [s.make_cache() for s in self.stages]

        def through(tokens: list[int]) -> mx.array:
            x = mx.array(tokens)[None]
            for s, c in zip(self.stages, caches):
                x = s.forward(x, c)
            return x

        for start, end, checkpoint in prefill_chunks(len(prompt), reuse.keep if reuse else 0, self.step,
                                                     set(checkpoints)):
            through(prompt[start:end])
            mx.eval([c.state for cache in caches for c in cache])
            if checkpoint:
                self._store(prompt[:end], caches, "system", snapshot=True)
        out, token, tokens = [], prompt[-1], []
        for _ in range(max_tokens):
            lp = self.stages[-1].logprobs(through([token]))
            token = int(mx.argmax(lp, axis=-1).item())
            out.append((token, lp))
            tokens.append(token)
        position = len(prompt) + max_tokens - 1
        self._store((prompt + tokens)[:position], caches, "assistant", snapshot=False)
        return _trace_from_vectors(out), reuse

    def _store(self, tokens: list[int], caches: list[list[Any]], kind: str, snapshot: bool) -> None:
        entry = self.index.add(tokens, kind)
        for i, (store, cache) in enumerate(zip(self.stores, caches)):
            ack = store.store(entry, cache, len(tokens), snapshot=snapshot)
            for victim in self.index.stored(i, entry, ack["bytes"], ack["trimmable"], ack["tokens"], ack["floor"]):
                for st in self.stores:
                    st.drop([victim])
