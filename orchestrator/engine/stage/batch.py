"""Micro-batched decode with the family's own code: B requests, one forward, each row exact.

A decode step of B requests runs the family's `Model.__call__` once on [B, 1] inputs, so
every projection, MLP and MoE reads its weights once for all rows. Attention cannot be
batched exactly (each request has its own cache and length), so each layer sees a
`RowCaches`: it updates every request's own cache, hands the family placeholder keys, and
the family's call of mlx-lm's shared `scaled_dot_product_attention` is answered row by
row against each request's real keys — the very computation of a solo step.

Families whose attention uses the fetched keys itself are named in `support.ROW_ATTENTION`:
their attention module runs once per request (`RowSplitAttention`), the rest batched.

Exactness is by construction or not at all: if a family uses the fetched keys in any other
way (its own attention code, MLA's absorbed projections), reads a per-row offset as a
Python number, or hands a per-row mask to code that expects an array, the placeholders go
unconsumed or an error is raised before anything is evaluated; the caller then restores
every cache and runs the rows one by one (`BatchUnavailable`).
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import ArraysCache, CacheList, RotatingKVCache

from orchestrator.engine.stage.stand_ins import hidden_argument


class BatchUnavailable(RuntimeError):
    """This step cannot run as one batch exactly; run its rows one by one."""


class RowCaches:
    """One layer's caches of B requests, presented to the family's code as one batch cache."""

    def __init__(self, rows: list[Any]) -> None:
        self.rows = rows
        self.placeholders: tuple[mx.array, mx.array] | None = None
        self.fetched: list[tuple[mx.array, mx.array]] = []

    @property
    def offset(self) -> int | mx.array:
        """Per-row positions (an array RoPE applies row by row), or one int when all agree."""
        offsets = [r.offset for r in self.rows]
        return offsets[0] if len(set(offsets)) == 1 else mx.array(offsets)

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Update every request's own cache with its row; return placeholders for `attend`."""
        if self.placeholders is not None:
            raise BatchUnavailable("a layer fetched its cache twice in one step")
        self.fetched = [r.update_and_fetch(keys[b:b + 1], values[b:b + 1]) for b, r in enumerate(self.rows)]
        self.placeholders = (keys, values)
        return keys, values

    def keys_and_values(self) -> tuple["PerRow", "PerRow"]:
        """Every request's own keys and values, as a family's code reads them after its layers
        (AFM's KV-reuse layers attend over the last cache's): one entry per row, which the
        row-split attention of the layers handed them (support.ROW_ATTENTION) takes row by row."""
        pairs = [r.keys_and_values() for r in self.rows]
        return PerRow(k for k, _ in pairs), PerRow(v for _, v in pairs)

    def make_mask(self, n: int, **kwargs: Any) -> Any:
        """Each row's own mask; None when no row needs one (a decode step without window)."""
        masks = [r.make_mask(n, **kwargs) for r in self.rows]
        if all(m is None for m in masks):
            return None
        return RowMasks(masks)

    def consumed(self) -> bool:
        """Whether the family's attention consumed the placeholders through `attend` (or never fetched)."""
        return self.placeholders is None

    def attend(self, queries: mx.array, keys: mx.array, values: mx.array, mask: Any,
               original: Callable[..., mx.array], **kwargs: Any) -> mx.array:
        """The family's attention call, row by row against each request's real keys."""
        if self.placeholders is None or keys is not self.placeholders[0] or values is not self.placeholders[1]:
            raise BatchUnavailable("attention keys were transformed after the cache fetch")
        if isinstance(mask, mx.array):
            raise BatchUnavailable("a batch-wide mask array cannot be split by row")
        self.placeholders = None
        masks = mask.masks if isinstance(mask, RowMasks) else [mask] * len(self.rows)
        outs = [original(queries[b:b + 1], k, v, cache=r, mask=m, **kwargs)
                for b, (r, (k, v), m) in enumerate(zip(self.rows, self.fetched, masks))]
        return mx.concatenate(outs, axis=0)

    def __getattr__(self, key: str) -> Any:
        # Any other cache attribute a family reads (bits, lengths, ...): only when every row agrees.
        values = [getattr(r, key) for r in self.__dict__["rows"]]
        if any(callable(v) for v in values) or any(v is not values[0] and v != values[0] for v in values[1:]):
            raise BatchUnavailable(f"cache attribute {key!r} differs by row")
        return values[0]


class RowSplitAttention(nn.Module):
    """A family's attention module called once per request inside a batched step.

    For families whose attention uses the fetched keys itself (gemma2's soft-capped scores,
    MLA's absorbed projections): each row runs the family's own attention with its own cache,
    while the rest of the layer (MLP, MoE) stays batched. Other arrays the layer hands its
    attention with one entry per row (Mistral 4's per-position attention scale) are given
    row by row too. Outside a batch it is the module.
    """

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def __getattr__(self, key: str) -> Any:
        # The family's make_cache and __call__ read plain attributes off the attention module
        # (MiniMax-M3's is_sparse_attn): they fall through to the wrapped module.
        if key in self:
            return self[key]
        if "inner" not in self:  # during __init__
            raise AttributeError(key)
        return getattr(self["inner"], key)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        x, args, kwargs = hidden_argument(args, kwargs)  # PLaMo passes it as hidden_states=
        batch = next((a for a in (*args, *kwargs.values()) if _row_caches_of(a) or isinstance(a, PerRow)), None)
        if batch is None:
            return self.inner(x, *args, **kwargs)

        def pick(value: Any, b: int) -> Any:
            if isinstance(value, PerRow):
                return value[b]
            if value is batch:
                members = _row_caches_of(batch)
                return members[0].rows[b] if isinstance(batch, RowCaches) else CacheList(*(m.rows[b] for m in members))
            if isinstance(value, RowMasks):
                return value.masks[b]
            if isinstance(value, mx.array) and value.ndim >= 2 and value.shape[0] == rows > 1:
                return value[b:b + 1]  # a per-row input beside the hidden state (Mistral 4's attention scale)
            if isinstance(value, mx.array) and value.ndim == 1 and value.shape[0] == rows > 1 \
                    and mx.issubdtype(value.dtype, mx.integer):
                return value[b]  # per-row positions (Gemma 3n hands its attention the first cache's offsets)
            return value

        rows = x.shape[0]
        outs = [self.inner(x[b:b + 1], *(pick(a, b) for a in args), **{k: pick(v, b) for k, v in kwargs.items()})
                for b in range(rows)]
        if isinstance(outs[0], tuple):  # Gemma 4: (output, K/V, offset); the K/V feed its KV-shared layers
            return (mx.concatenate([o[0] for o in outs], axis=0),
                    *(PerRow(o[i] for o in outs) for i in range(1, len(outs[0]))))
        return mx.concatenate(outs, axis=0)


class PerRow(tuple):
    """What a row-split attention returned beside its output, one entry per request (Gemma 4's
    K/V and offset): a later attention module that is handed it runs row by row too, each row
    on its own request's entry (its KV-shared layers attend over that request's keys)."""


def _row_caches_of(value: Any) -> list[RowCaches]:
    """The RowCaches a batched attention call received: itself, or every member of a CacheList
    (DeepSeek-V3.2's latent and indexer caches); empty for anything else."""
    if isinstance(value, RowCaches):
        return [value]
    if isinstance(value, CacheList) and value.caches and all(isinstance(c, RowCaches) for c in value.caches):
        return list(value.caches)
    return []


def split_attention_by_row(layer: nn.Module, name: str) -> None:
    """Wrap `layer.<name>` (its attention module, or each of a list of them: LongCat-Flash's
    two per layer) in `RowSplitAttention`."""
    inner = layer[name]
    if isinstance(inner, list):
        layer[name] = [RowSplitAttention(module) for module in inner]
    else:
        layer[name] = RowSplitAttention(inner)


class RowStates(ArraysCache):
    """One recurrent layer's states (linear attention, SSM) of B requests, stacked by row."""

    def __init__(self, rows: list[ArraysCache]) -> None:
        super().__init__(len(rows[0].cache))
        self.rows = rows
        for i in range(len(self.cache)):
            parts = [r.cache[i] for r in rows]
            if all(p is None for p in parts):
                continue  # a layer this stage skips: it never holds a state
            if any(p is None for p in parts):
                raise BatchUnavailable("a request has no recurrent state yet")
            self.cache[i] = mx.concatenate(parts, axis=0)

    def write_back(self) -> None:
        """Give every request its row of the new states."""
        for b, r in enumerate(self.rows):
            for i, state in enumerate(self.cache):
                if state is not None:
                    r.cache[i] = state[b:b + 1]


class RowMasks:
    """Per-row masks of one batched step; only `RowCaches.attend` knows how to use them."""

    def __init__(self, masks: list[Any]) -> None:
        self.masks = masks


def batch_caches(caches: list[list[Any]]) -> list[Any]:
    """Layer by layer, the B requests' caches as one batch cache (RowStates, RowCaches or,
    for a layer holding several caches, a CacheList of those)."""
    return [_batch_layer(list(layer_caches)) for layer_caches in zip(*caches)]


def _batch_layer(rows: list[Any]) -> Any:
    if all(type(c) is ArraysCache for c in rows):
        return RowStates(rows)
    if all(type(c) is CacheList and len(c.caches) == len(rows[0].caches) for c in rows):
        # A hybrid layer's members (Falcon-H1: SSM state and KV cache), each batched by its kind.
        return CacheList(*(_batch_layer([c.caches[i] for c in rows]) for i in range(len(rows[0].caches))))
    if all(hasattr(c, "update_and_fetch") for c in rows):
        return RowCaches(rows)
    raise BatchUnavailable(f"no batched form for {type(rows[0]).__name__}")


def batch_parts(batched: list[Any]) -> list[Any]:
    """The RowCaches and RowStates of a batch's layer caches, CacheList members included."""
    out = []
    for cache in batched:
        out.extend(batch_parts(list(cache.caches)) if isinstance(cache, CacheList) else [cache])
    return out


def snapshot(caches: list[list[Any]], held: bool = False) -> list[list[Any]]:
    """Every cache's fields, a CacheList's members' too (MLX arrays are immutable values, so
    references suffice). A one-position step into a full window writes in place, though
    (RotatingKVCache's `keys[..., i, :] = k` rebinds the very array object a reference shares):
    with `held` (a rewind point, rewind.py) a window's arrays are kept as new array objects of the
    old values, so a write then copies the buffer rather than changing what was kept."""
    return [[_fields(c, held) for c in cache] for cache in caches]


def _fields(c: Any, held: bool) -> tuple[dict[str, Any], list[Any]]:
    members = [_fields(m, held) for m in c.caches] if isinstance(c, CacheList) else []
    return _copied(vars(c), held and isinstance(c, RotatingKVCache)), members


def _copied(fields: dict[str, Any], own: bool) -> dict[str, Any]:
    """The fields with lists copied, and with `own` every array as a new object of its value."""
    def one(v: Any) -> Any:
        return v[...] if own and isinstance(v, mx.array) else v

    return {k: [one(a) for a in v] if isinstance(v, list) else one(v) for k, v in fields.items()}


def restore(caches: list[list[Any]], saved: list[list[Any]], held: bool = False) -> None:
    """Put every cache back as `snapshot` found it (`saved` may be restored again later; with `held`,
    a window's arrays again as new objects, so a later in-place write leaves `saved` as it was)."""
    for cache, fields in zip(caches, saved):
        for c, f in zip(cache, fields):
            _put_back(c, f, held)


def _put_back(c: Any, saved: tuple[dict[str, Any], list[Any]], held: bool) -> None:
    fields, members = saved
    vars(c).clear()
    vars(c).update(_copied(fields, held and isinstance(c, RotatingKVCache)))  # saved stays as saved
    for m, f in zip(c.caches if members else (), members):
        _put_back(m, f, held)


def install_row_attention() -> None:
    """Let mlx-lm's shared attention answer `RowCaches` row by row (idempotent).

    Families import `scaled_dot_product_attention` from `mlx_lm.models.base` into their own
    module, so the wrapper is set there; for any other cache it is the original function.
    """
    from mlx_lm.models import base

    original = getattr(base.scaled_dot_product_attention, "row_original", base.scaled_dot_product_attention)

    def attention(queries, keys, values, cache, scale, mask, **kwargs):
        if isinstance(cache, RowCaches):
            return cache.attend(queries, keys, values, mask, original, scale=scale, **kwargs)
        return original(queries, keys, values, cache=cache, scale=scale, mask=mask, **kwargs)

    attention.row_original = original  # type: ignore[attr-defined]
    for name, module in list(sys.modules.items()):
        if name.startswith("mlx_lm.models.") and getattr(module, "scaled_dot_product_attention", None) is not None:
            if not hasattr(module.scaled_dot_product_attention, "row_original"):
                module.scaled_dot_product_attention = attention
