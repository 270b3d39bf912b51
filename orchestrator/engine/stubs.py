"""Stand-ins for the parts of a model that a stage does not own.

A stage runs the family's own `Model.__call__` (embedding and its scaling, mask
construction at global layer indices, every layer's own cache, final norm, head,
soft-capping), so nothing of a family's forward is copied here. What changes is the
layer list and the ends of the model:

* `Skip` replaces a layer outside the stage's range. It passes the hidden state through
  and advances the layer's cache by the step's length with zero-width keys, so masks that
  the family builds from *that* layer's cache (a global layer's, a sliding layer's) see the
  same offsets as in one process, at no memory cost.
* `Entry` wraps the stage's first layer on every stage but the first: it replaces whatever
  reached it (the embedding stand-in's zeros) with the hidden state received from upstream.
* `Exit` wraps the stage's last layer on every stage but the last and keeps its output,
  which is what travels downstream. Whatever the model computes after it (skipped layers,
  norm, head) is never evaluated: MLX is lazy and the stage evaluates only that output.
* `Hollow` replaces an embedding, norm or head the stage does not own, so its weights are
  never read from disk.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import ArraysCache, CacheList, KVCache

# Plain attributes the family's __call__ or make_cache read off a layer (block_type,
# is_linear, use_sliding, ...) or off its sub-modules are copied onto its stand-in; arrays
# are not.
_PLAIN = (bool, int, float, str, type(None))


def _advance(cache: Any, length: int, batch: int) -> None:
    """Move a skipped layer's cache forward by `length` positions without storing anything."""
    rows = getattr(cache, "rows", None)  # a micro-batch's per-request caches (batch.py)
    if rows is not None:
        for row in rows:
            _advance(row, length, 1)
    elif isinstance(cache, CacheList):
        for c in cache.caches:
            _advance(c, length, batch)
    elif isinstance(cache, ArraysCache):
        return  # recurrent state: its masks depend on padding only, never on position
    elif type(cache) is KVCache:
        cache.offset += length  # its masks read only the offset: no arrays at all (the common case)
    elif hasattr(cache, "update_and_fetch"):
        empty = mx.zeros((batch, 1, length, 0))
        cache.update_and_fetch(empty, empty)  # the cache's own offset / rotation bookkeeping
    elif hasattr(cache, "offset"):
        cache.offset += length


def _caches_in(args: tuple, kwargs: dict) -> list[Any]:
    return [a for a in (*args, *kwargs.values()) if hasattr(a, "update_and_fetch") or isinstance(a, (ArraysCache, CacheList))]


def _copy_plain(source: nn.Module, target: nn.Module) -> None:
    """Copy `source`'s plain attributes onto `target`, and its sub-modules as `Shadow`s."""
    for key, value in vars(source).items():
        if not key.startswith("_") and isinstance(value, _PLAIN):
            setattr(target, key, value)
    for key, value in source.items():
        if isinstance(value, nn.Module):
            target[key] = Shadow(value)


class Shadow(nn.Module):
    """A skipped layer's sub-module reduced to its plain attributes, weightless and never called:
    some families' make_cache reads them there (EXAONE 4's `layer.self_attn.is_local`)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        _copy_plain(module, self)


class Skip(nn.Module):
    """A layer outside the stage's range: identity on the hidden state, cache kept in step."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        _copy_plain(layer, self)

    def __call__(self, x: mx.array, *args: Any, **kwargs: Any) -> mx.array:
        for cache in _caches_in(args, kwargs):
            _advance(cache, x.shape[1], x.shape[0])
        return x


class _Wrapper(nn.Module):
    """A layer the stage runs, wrapped; attribute reads fall through to the layer itself."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def __getattr__(self, key: str) -> Any:
        if key in self:
            return self[key]
        if "layer" not in self:  # during __init__
            raise AttributeError(key)
        return getattr(self["layer"], key)


class Entry(_Wrapper):
    """The stage's first layer on a non-first stage: runs on the hidden state given to `feed`."""

    def feed(self, h: mx.array) -> None:
        """The hidden state from upstream for the next call (kept off the parameter tree)."""
        object.__setattr__(self, "_incoming", h)

    def __call__(self, x: mx.array, *args: Any, **kwargs: Any) -> mx.array:
        h = self.__dict__.pop("_incoming", None)
        if h is None:
            raise RuntimeError("stage entry called without a hidden state from upstream")
        return self.layer(h, *args, **kwargs)


class Exit(_Wrapper):
    """The stage's last layer on a non-last stage: keeps its output for `take`."""

    def __call__(self, x: mx.array, *args: Any, **kwargs: Any) -> mx.array:
        out = self.layer(x, *args, **kwargs)
        object.__setattr__(self, "_outgoing", out)
        return out

    def take(self) -> mx.array:
        """The output of the last call (what travels downstream)."""
        return self.__dict__.pop("_outgoing")


class Hollow(nn.Module):
    """An embedding, norm or head the stage does not own: no weights, shape-correct output.

    As an embedding it yields zeros [B, L, hidden] (replaced at the stage's `Entry`); as a
    norm or head it is the identity (its result is never evaluated on this stage).
    """

    def __init__(self, role: str, hidden: int, dtype: mx.Dtype) -> None:
        super().__init__()
        self.role, self.hidden, self.dtype = role, hidden, dtype

    def __call__(self, x: mx.array, *args: Any, **kwargs: Any) -> mx.array:
        if self.role == "embedding":
            return mx.zeros((*x.shape, self.hidden), self.dtype)
        return x

    def as_linear(self, x: mx.array) -> mx.array:
        """A tied head on a stage that does not own it: never evaluated."""
        return x
