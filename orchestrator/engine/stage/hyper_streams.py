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
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from orchestrator.engine.hyper_layout import FAMILY
from orchestrator.engine.tensors import Expected

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


def hyper_streams(family: str, view: dict[str, Any], start: int, end: int, last: bool) -> HyperStreams | None:
    """The boundary codec of a family whose hidden state is residual streams (support.STREAMS)."""
    return HyperStreams(view, start, end, last) if family == FAMILY else None
