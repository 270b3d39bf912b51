"""DeepSeek-V4.1 across a stage boundary: its residual streams and the state its layers share.

Its hidden state between layers is `hc_mult` parallel residual streams, [B, L, hc, H], which
cross as the NAMED frame's `h`; each layer also hands the next the pre-mix that collapses the
streams into its input ([B, L, hc], float32: `pre_mix`, the layer's second argument). Beyond
that, its layers share state through a dict the model's loop passes every layer (`shared`):
the compressed K/V and index keys that a few source layers append to their own cache and later
layers attend over, the top-k picks of an indexer layer that the next layers reuse, and one
layer's candidate blocks. A boundary carries what the layers after it read from layers before
it (mlx-lm's own `_crossing`), shaped by mlx-lm's own `_layout`: only the compressed entries
this step added (the next stage appends them to its first layer's cache, as mlx-lm's pipeline
does), the picks of this step, one flag per candidate block.

A rollback's replay (engine/stage/rewind.py) cuts and joins what crossed by position: `GroupedParts`
does it for one boundary with mlx-lm's `_layout` of the positions wanted (per-token parts by token,
compressed entries by the groups those tokens complete, picks and flags to the width of their end).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from orchestrator.engine.stage.carry import Carry, join, positions
from orchestrator.engine.tensors import Expected
from orchestrator.families.hyper_layout import FAMILY

STREAMS_MIX = "pre_mix"  # the NAMED frame's name of the pre-mix; the streams are its `h`


class HyperStreams:
    """One stage's side of DeepSeek-V4.1's boundaries: layers [start, end) of the model."""

    def __init__(self, view: dict[str, Any], start: int, end: int, last: bool) -> None:
        from mlx_lm.models import deepseek_v41 as family  # only a DeepSeek-V4.1 stage imports its module

        self._family = family
        self.args = family.ModelArgs.from_dict(view)
        self.block = self.args.candidate_block_size
        self.incoming: dict[str, int] = family._crossing(self.args, start) if start else {}
        self.outgoing: dict[str, int] = {} if last else family._crossing(self.args, end)
        # how a replay cuts and joins this stage's input and its output (rewind.py)
        self.inputs = GroupedParts(family, self.args, self.incoming)
        self.outputs = GroupedParts(family, self.args, self.outgoing)

    def expected(self, position: int, length: int, dtype: mx.Dtype) -> dict[str, Expected]:
        """What arrives with the streams for a step of `length` tokens from `position`: the pre-mix
        and each shared part, shaped as mlx-lm's pipeline lays them out."""
        layout = self._family._layout(self.args, self.incoming, 1, length, position, dtype)
        return {key: Expected(shape[1:], dt) for key, shape, dt in layout if key != "streams"}

    def receive(self, parts: dict[str, mx.array], position: int, length: int, kwargs: dict[str, Any]) -> None:
        """Put what arrived into the stage's first layer's call: compressed entries appended to its
        cache (which that layer never writes: it is not their source), the rest into `shared`."""
        cache, shared = kwargs["cache"], kwargs["shared"]
        for key, source in self.incoming.items():
            part = parts[key]
            if key in self._family._CACHE_FIELDS:
                if part.shape[1]:
                    setattr(cache, key, self._family._append(getattr(cache, key), part))
                shared[key] = getattr(cache, key)
            elif key == "candidates":
                keys = self._family._index_keys(self.args, source, position + length)
                mask = mx.repeat(part, self.block, axis=-1)
                shared[key] = mask[..., :keys] if keys else None
            else:
                shared[key] = part

    def send(self, shared: dict[str, Any], position: int, batch: int, length: int,
             dtype: mx.Dtype) -> dict[str, mx.array]:
        """What the layers after this stage read of `shared` after its last layer: the parts of
        mlx-lm's layout but the streams and the pre-mix (the layer's own output)."""
        out = {}
        for key, shape, dt in self._family._layout(self.args, self.outgoing, batch, length, position, dtype)[2:]:
            part = shared.get(key)
            if part is None:
                part = mx.zeros(shape, dt)  # not written yet: the layout has no entries either
            elif key in self._family._CACHE_FIELDS:
                part = part[:, part.shape[1] - shape[1]:]  # only this step's entries
            elif key == "candidates":
                part = part[..., ::self.block]
            if part.shape != shape or part.dtype != dt:
                raise ValueError(f"the next stage expects {key} as {dt} {shape}, not {part.dtype} {part.shape}")
            out[key] = part
        return out


class GroupedParts:
    """What crosses one boundary, cut and joined by absolute position (a replay's inputs and the output
    it drops, engine/stage/rewind.py), shaped as mlx-lm's `_layout` lays out a step of those positions.

    Per token: the streams, the pre-mix, the picks and the candidate flags. The compressed entries and
    index keys: the groups the tokens complete. The picks' width (at most `index_topk` of the index keys
    at a step's end) and the flags' (one per candidate block of those keys) follow the step's end: a
    wider part is cut (a row holds no pick or flag beyond the keys its own position sees, so the picks
    are moved to the front of their row first, in order; -1 is none), a narrower one padded with none.
    """

    def __init__(self, family: Any, args: Any, crossing: dict[str, int]) -> None:
        self._family, self.args, self.crossing = family, args, crossing

    def _shapes(self, batch: int, length: int, position: int) -> dict[str, tuple[int, ...]]:
        layout = self._family._layout(self.args, self.crossing, batch, length, position, mx.float32)
        return {key: shape for key, shape, _ in layout}

    def positions(self, x: Any, at: int, start: int, stop: int | None = None) -> Any:
        """Positions [start, stop) of `x`, whose first position is `at` (token ids and logits by position)."""
        if not isinstance(x, Carry):
            return positions(x, start, stop)
        stop = int(x.h.shape[1]) if stop is None else stop
        batch = int(x.h.shape[0])
        before = self._shapes(batch, start, at)  # the entries of the groups completed before `start`
        want = self._shapes(batch, stop - start, at + start)
        extras = {}
        for key, part in x.extras.items():
            if key in self._family._CACHE_FIELDS:
                skip = before[key][1]
                extras[key] = part[:, skip:skip + want[key][1]]
            else:
                extras[key] = _fit(part[:, start:stop], want[key][-1])
        return _checked(Carry(x.h[:, start:stop], extras), want)

    def join(self, xs: list[Any], at: int) -> Any:
        """Inputs or outputs of consecutive positions from `at` as one."""
        if len(xs) == 1 or not isinstance(xs[0], Carry):
            return join(xs)
        want = self._shapes(int(xs[0].h.shape[0]), sum(int(x.h.shape[1]) for x in xs), at)
        extras = {key: mx.concatenate([x.extras[key] if key in self._family._CACHE_FIELDS
                                       else _fit(x.extras[key], want[key][-1]) for x in xs], axis=1)
                  for key in xs[0].extras}
        return _checked(Carry(mx.concatenate([x.h for x in xs], axis=1), extras), want)


def _fit(part: mx.array, width: int) -> mx.array:
    """A per-token part at `width` along its last axis: picks (-1: none) or candidate flags (False: none)."""
    have = int(part.shape[-1])
    if have == width or part.dtype not in (mx.int32, mx.bool_):
        return part
    none = False if part.dtype == mx.bool_ else -1
    if have < width:
        return mx.pad(part, [(0, 0)] * (part.ndim - 1) + [(0, width - have)], constant_values=none)
    if part.dtype == mx.int32:  # the row's picks first, in their order; then the nones
        order = mx.argsort(mx.where(part < 0, have, 0) + mx.arange(have), axis=-1)
        part = mx.take_along_axis(part, order, axis=-1)
    return part[..., :width]


def _checked(x: Carry, want: dict[str, tuple[int, ...]]) -> Carry:
    """`x`, after checking its parts have the layout's shapes (a wrong cut must not run)."""
    for key, part in (("streams", x.h), *x.extras.items()):
        if tuple(part.shape[:2]) != want[key][:2] or (key != "streams" and tuple(part.shape) != want[key]):
            raise ValueError(f"{key} cut as {tuple(part.shape)}, the layout says {want[key]}")
    return x


def hyper_streams(family: str, view: dict[str, Any], start: int, end: int, last: bool) -> HyperStreams | None:
    """The boundary codec of a family whose hidden state is residual streams (support.STREAMS)."""
    return HyperStreams(view, start, end, last) if family == FAMILY else None
