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
* `Given` wraps each layer a stage beyond the first runs, in a family whose layers all take a
  tensor the model computes before its layers (Talkie's normalised token embedding): that
  argument is the one received from upstream.
* `Checkpoint` wraps each layer the stage runs, so that a long step can be evaluated layer by
  layer and abandoned between two (engine/stage/interrupt.py).
* `Hollow` replaces an embedding, norm or head the stage does not own, so its weights are
  never read from disk.
"""

from __future__ import annotations

from collections.abc import Callable
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
    elif hasattr(cache, "update_window"):  # DeepSeek-V4.1's LayerCache: its window's rows and offset count
        cache.update_window(mx.zeros((batch, length, 0)))
    elif type(cache) is KVCache:
        cache.offset += length  # its masks read only the offset: no arrays at all (the common case)
    elif hasattr(cache, "update_and_fetch"):
        empty = mx.zeros((batch, 1, length, 0))
        cache.update_and_fetch(empty, empty)  # the cache's own offset / rotation bookkeeping
    elif hasattr(cache, "offset"):
        cache.offset += length


def advance_skipped(cache: Any, length: int) -> None:
    """Bring a fresh skipped layer's cache (one request) to position `length` (a prompt-cache
    entry read back from disk: such caches are not written, only their position counts)."""
    _advance(cache, length, 1)


def keep_readable(cache: Any) -> None:
    """A skipped layer's plain KVCache that the family's code reads after its layers (AFM's
    `cache[-1].keys_and_values()`, support.READ_AFTER_LAYERS): given zero-size keys and values,
    so the read returns them instead of failing on keys that were never stored. Its offset still
    counts positions (`_advance`); nothing is stored, and the layers that would attend over the
    keys are skipped too (support.shared_kv_cuts keeps them with the layer that owns them)."""
    if type(cache) is KVCache and cache.keys is None:
        cache.keys = cache.values = mx.zeros((1, 1, 0, 0))


def _caches_in(args: tuple, kwargs: dict) -> list[Any]:
    return [a for a in (*args, *kwargs.values())
            if hasattr(a, "update_and_fetch") or hasattr(a, "update_window") or isinstance(a, (ArraysCache, CacheList))]


# Names a family passes its hidden state by when it calls a layer with keywords (GPT-J: inputs=).
_HIDDEN_KEYWORDS = ("x", "inputs", "hidden_states", "h")


def hidden_argument(args: tuple, kwargs: dict, at: int = 0) -> tuple[mx.array, tuple, dict]:
    """The hidden state a layer was called with (positional argument `at`, support.HIDDEN_AT),
    and the remaining arguments."""
    if len(args) > at:
        return args[at], (*args[:at], *args[at + 1:]), kwargs
    for key in _HIDDEN_KEYWORDS:
        if key in kwargs:
            rest = dict(kwargs)
            return rest.pop(key), args, rest
    raise TypeError("a layer was called without a hidden state")


def with_hidden(args: tuple, kwargs: dict, h: mx.array, at: int = 0) -> tuple[tuple, dict]:
    """A layer's arguments with its hidden state (positional argument `at`, or by keyword) replaced by `h`."""
    if len(args) > at:
        return (*args[:at], h, *args[at + 1:]), kwargs
    for key in _HIDDEN_KEYWORDS:
        if key in kwargs:
            return args, {**kwargs, key: h}
    raise TypeError("a layer was called without a hidden state")


def _copy_plain(source: nn.Module, target: nn.Module) -> None:
    """Copy `source`'s plain attributes onto `target`, and its sub-modules as `Shadow`s."""
    for key, value in vars(source).items():
        if not key.startswith("_") and isinstance(value, _PLAIN):
            setattr(target, key, value)
    # Plain properties of the layer's class too (Spark 2.5's is_sliding reads its attention's).
    for cls in type(source).__mro__:
        if cls is nn.Module:
            break
        for key, attr in vars(cls).items():
            if isinstance(attr, property) and not key.startswith("_") and not hasattr(target, key):
                try:
                    value = getattr(source, key)
                except (AttributeError, TypeError, ValueError, KeyError, IndexError):  # needs state it lacks
                    continue
                if isinstance(value, _PLAIN):
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


class _Mimic(nn.Module):
    """A stand-in that passes the family's `isinstance` checks as the layer it replaces
    (OLMo-hybrid picks each layer's mask by its class): `isinstance` consults `__class__`."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "_mimic", layer.__class__)  # a wrapped wrapper passes on what it mimics

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return self.__dict__.get("_mimic", type(self))


class Skip(_Mimic):
    """A layer outside the stage's range: identity on the hidden state, cache kept in step.

    `returns` > 1: the family's layers return a tuple (hidden state first, then what its loop
    hands to later layers, Gemma 4's K/V and offset); a skipped layer returns the hidden state
    and Nones, which only a layer this stage also skips can read (support.shared_kv_cuts), or,
    with `passes`, the argument of that keyword or position as it was given (Kimi-K3's residual
    blocks, DeepSeek-V4.1's pre-mix).
    """

    def __init__(self, layer: nn.Module, returns: int = 1, hidden_at: int = 0, passes: int | str | None = None,
                 leading: int = 0, advances: bool = True) -> None:
        super().__init__(layer)
        _copy_plain(layer, self)
        object.__setattr__(self, "_returns", returns)
        object.__setattr__(self, "_hidden_at", hidden_at)
        object.__setattr__(self, "_passes", passes)
        object.__setattr__(self, "_leading", leading)  # axes before the batch (Gemma 3n's AltUp streams)
        object.__setattr__(self, "_advances", advances)  # False: the cache it is handed is another layer's

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        passes = self.__dict__["_passes"]
        # handed on as it came (support.PASSED_ON: the model's code reads it after the loop)
        passed = kwargs.get(passes) if isinstance(passes, str) else None if passes is None else args[passes]
        x, args, kwargs = hidden_argument(args, kwargs, self.__dict__["_hidden_at"])
        lead = self.__dict__["_leading"]
        for cache in _caches_in(args, kwargs) if self.__dict__["_advances"] else ():
            _advance(cache, x.shape[lead + 1], x.shape[lead])
        returns = self.__dict__["_returns"]
        if passes is not None:
            return x, passed
        return x if returns == 1 else (x, *([None] * (returns - 1)))


class _Wrapper(_Mimic):
    """A layer the stage runs, wrapped; attribute reads fall through to the layer itself."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__(layer)
        self.layer = layer

    def __getattr__(self, key: str) -> Any:
        if key in self:
            return self[key]
        if "layer" not in self:  # during __init__
            raise AttributeError(key)
        return getattr(self["layer"], key)


class Entry(_Wrapper):
    """The stage's first layer on a non-first stage: runs on the hidden state given to `feed`,
    and on what the previous layer handed on (Hunyuan's shared K/V) when upstream sent it;
    `hidden_at`: which positional argument of the layer is the hidden state (support.HIDDEN_AT)."""

    def __init__(self, layer: nn.Module, hidden_at: int = 0) -> None:
        super().__init__(layer)
        object.__setattr__(self, "_hidden_at", hidden_at)

    def feed(self, h: mx.array, handed: tuple[int | str, Any] | None = None,
             before: Callable[[dict[str, Any]], None] | None = None) -> None:
        """The hidden state from upstream for the next call (kept off the parameter tree),
        `handed` = (argument position or keyword, value) to put in place of what the skipped
        layer handed on, and `before`, given the call's keyword arguments first (DeepSeek-V4.1's
        shared state goes into its `shared` dict and its cache: hyper_streams.py)."""
        object.__setattr__(self, "_incoming", h)
        object.__setattr__(self, "_handed", handed)
        object.__setattr__(self, "_before", before)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        h = self.__dict__.pop("_incoming", None)
        if h is None:
            raise RuntimeError("stage entry called without a hidden state from upstream")
        handed = self.__dict__.pop("_handed", None)
        before = self.__dict__.pop("_before", None)
        if before is not None:
            before(kwargs)
        if handed is not None and isinstance(handed[0], str):
            kwargs = {**kwargs, handed[0]: handed[1]}
        elif handed is not None:
            at, value = handed
            if len(args) <= at:
                raise RuntimeError(f"the layer was not handed argument {at} to replace")
            args = (*args[:at], value, *args[at + 1:])
        args, kwargs = with_hidden(args, kwargs, h, self.__dict__["_hidden_at"])
        return self.layer(*args, **kwargs)


class Exit(_Wrapper):
    """The stage's last layer on a non-last stage: keeps its output for `take`, its argument
    `keep_arg` for `kept` (Talkie's normalised embedding, which every later layer takes too), and
    with `keep_keywords` its keyword arguments for `keywords` (DeepSeek-V4.1's shared state)."""

    def __init__(self, layer: nn.Module, keep_arg: int | None = None, keep_keywords: bool = False) -> None:
        super().__init__(layer)
        object.__setattr__(self, "_keep_arg", keep_arg)
        object.__setattr__(self, "_keep_keywords", keep_keywords)

    def __call__(self, *args: Any, **kwargs: Any) -> mx.array:
        out = self.layer(*args, **kwargs)
        object.__setattr__(self, "_outgoing", out)
        if self.__dict__["_keep_keywords"]:
            object.__setattr__(self, "_keywords", kwargs)
        at = self.__dict__["_keep_arg"]
        if at is not None:
            object.__setattr__(self, "_kept", args[at])
        if isinstance(out, mx.array):
            # The model's code after its loop may write into the array it gets (Gemma 3n's
            # `h[1:] = ...`, in place): it gets its own handle, the kept output stays as it was.
            return mx.stop_gradient(out)
        return out

    def kept(self) -> mx.array:
        """The last call's argument `keep_arg`."""
        return self.__dict__.pop("_kept")

    def keywords(self) -> dict[str, Any]:
        """The last call's keyword arguments (DeepSeek-V4.1's `shared` dict and `start_pos`)."""
        return self.__dict__.pop("_keywords")

    def take(self) -> mx.array:
        """The hidden state of the last call's output (what travels downstream)."""
        return self.take_all()[0]

    def take_all(self) -> tuple:
        """The last call's whole output: the hidden state, then what the layer hands on."""
        out = self.__dict__.pop("_outgoing")
        return out if isinstance(out, tuple) else (out,)


class Checkpoint(_Wrapper):
    """A layer the stage runs, whose output it may evaluate on its own and then abandon the step
    (engine/stage/interrupt.py: a long step a RESET can stop between layers)."""

    def __init__(self, layer: nn.Module, checks: Any) -> None:
        super().__init__(layer)
        object.__setattr__(self, "_checks", checks)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self.layer(*args, **kwargs)
        self.__dict__["_checks"].after_layer(out)
        return out


class GivenSource:
    """The tensor a stage received for its `Given` layers this step (set before each forward)."""

    value: Any = None


class Given(_Wrapper):
    """A layer the stage runs beyond the first stage, in a family whose layers all take a tensor
    the model computes once before its layers (Talkie's normalised token embedding,
    support.GIVEN_INPUT): its argument `at` is replaced by the one received from upstream."""

    def __init__(self, layer: nn.Module, at: int, source: GivenSource) -> None:
        super().__init__(layer)
        object.__setattr__(self, "_at", at)
        object.__setattr__(self, "_source", source)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        at, value = self.__dict__["_at"], self.__dict__["_source"].value
        if value is None or len(args) <= at:
            raise RuntimeError(f"a given layer was called without its argument {at} from upstream")
        return self.layer(*args[:at], value, *args[at + 1:], **kwargs)


class PerLayer(_Wrapper):
    """A layer (run or skipped) whose per-layer input comes from the stage's `PerLayerFeed`
    (engine/stage/carry.py): the received one beyond the first stage, kept when downstream."""

    def __init__(self, layer: nn.Module, index: int, feed: Any, at: int | None = None) -> None:
        super().__init__(layer)
        object.__setattr__(self, "_index", index)
        object.__setattr__(self, "_feed", feed)
        object.__setattr__(self, "_at", at)  # the argument's position (Gemma 3n), else the keyword

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        at = self.__dict__["_at"]
        if at is not None and len(args) > at:
            args = (*args[:at], self._feed.given(self._index, args[at]), *args[at + 1:])
        else:
            kwargs["per_layer_input"] = self._feed.given(self._index, kwargs.get("per_layer_input"))
        return self.layer(*args, **kwargs)


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
        if self.role == "projection":  # Gemma 4's per-layer projection beyond the first stage
            return mx.zeros((*x.shape[:-1], self.hidden), self.dtype)
        return x

    def as_linear(self, x: mx.array) -> mx.array:
        """A tied head on a stage that does not own it: never evaluated."""
        return x
