"""What crosses a stage boundary when a family passes more than the hidden state.

Gemma 4 (2B/4B) feeds every layer a per-layer input that parts outside the layer list
compute from the token ids and the embedding (its per-layer embedding, projection and
norm). Only the first stage owns those parts, so it computes the per-layer inputs with the
family's own code, and each boundary carries, beside the hidden state, the per-layer inputs
of the layers downstream of it: `Carry` on this side, a NAMED frame on the wire
(engine/tensors.py). A stage feeds each of its layers the slice the family's loop would
have given it (`PerLayerFeed`, through the `PerLayer` wrappers of stand_ins.py).

What a layer hands the next one (support.HANDED_ON) travels the same way; when that is an
object rather than tensors (Kimi-K3's attention residuals), `handed_codec` converts it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import mlx.core as mx

PER_LAYER = "per_layer"  # the name of the per-layer inputs in a NAMED frame


class Carry(NamedTuple):
    """The hidden state [B, L, H] and the extra tensors [B, L, ...] that travel with it.

    A tuple, so `mx.eval` evaluates it as it does any tree of arrays.
    """

    h: mx.array
    extras: dict[str, mx.array]

    @property
    def shape(self) -> tuple[int, ...]:
        """The hidden state's shape (what a stage reads its batch and length from)."""
        return tuple(self.h.shape)

    @property
    def dtype(self) -> mx.Dtype:
        """The hidden state's dtype."""
        return self.h.dtype


def concatenate(xs: list) -> mx.array | Carry:
    """Several requests' inputs as one batch (rows in order)."""
    if isinstance(xs[0], Carry):
        return Carry(mx.concatenate([x.h for x in xs], axis=0),
                     {k: mx.concatenate([x.extras[k] for x in xs], axis=0) for k in xs[0].extras})
    return mx.concatenate(xs, axis=0)


def row(out: mx.array | Carry, b: int) -> mx.array | Carry:
    """Row `b` of a batched output."""
    if isinstance(out, Carry):
        return Carry(out.h[b:b + 1], {k: v[b:b + 1] for k, v in out.extras.items()})
    return out[b:b + 1]


class PerLayerFeed:
    """One stage's per-layer inputs during one forward: those it was given for its layers
    and the ones downstream ([B, L, n - start, P]), and those the family computed for the
    layers downstream of it (`outgoing`, [B, L, n - end, P])."""

    def __init__(self, start: int, end: int, n: int) -> None:
        self.start, self.end, self.n = start, end, n
        self.incoming: mx.array | None = None
        self.taken: dict[int, mx.array] = {}

    def begin(self, incoming: mx.array | None) -> None:
        """A forward starts: what arrived from upstream (None on the first stage)."""
        self.incoming, self.taken = incoming, {}

    def given(self, index: int, computed: mx.array | None) -> mx.array | None:
        """The per-layer input layer `index` runs on (the received one beyond the first stage),
        kept when the layer lies downstream of this stage."""
        x = computed if self.incoming is None else self.incoming[:, :, index - self.start, :]
        if index >= self.end:
            self.taken[index] = x
        return x

    def outgoing(self) -> mx.array:
        """The per-layer inputs of the layers after this stage, in layer order."""
        missing = [j for j in range(self.end, self.n) if self.taken.get(j) is None]
        if missing:
            raise RuntimeError(f"no per-layer input reached layers {missing}")
        return mx.stack([self.taken[j] for j in range(self.end, self.n)], axis=2)


class AttentionResiduals:
    """Kimi-K3's attention residuals across a boundary.

    Its layers hand each other mlx-lm's own `ResidualBlocks` (the output of every block so far,
    each with its inverse RMS); a boundary carries the blocks as one [B, L, blocks, hidden]
    tensor, and the next stage appends them back one by one, as the layers that began them did,
    so the inverse RMS is computed from the same values by the same operation.
    """

    def __init__(self, eps: float) -> None:
        self.eps = eps

    def to_wire(self, blocks: Any) -> mx.array:
        """The blocks as [B, L, blocks, hidden]."""
        return mx.moveaxis(blocks.raw, 0, 2)

    def from_wire(self, tensor: mx.array) -> Any:
        """A `ResidualBlocks` holding the received blocks, in order."""
        from mlx_lm.models.kimi_k3 import ResidualBlocks  # only a Kimi-K3 stage imports its module

        blocks = ResidualBlocks(self.eps)
        for j in range(tensor.shape[2]):
            blocks.append(tensor[:, :, j, :])
        return blocks


def handed_codec(family: str, view: dict[str, Any]) -> AttentionResiduals | None:
    """How a family's handed-on state becomes tensors on the wire and back, when it is not
    already tensors (support.HANDED_ON): Kimi-K3's attention residuals; None for the others."""
    if family == "kimi_k3" and view.get("attn_res_block_size"):
        return AttentionResiduals(float(view.get("rms_norm_eps", 1e-5)))
    return None


def join(xs: list) -> mx.array | Carry:
    """One request's inputs of consecutive forwards as one input (positions in order, axis 1)."""
    if len(xs) == 1:
        return xs[0]
    if isinstance(xs[0], Carry):
        return Carry(mx.concatenate([x.h for x in xs], axis=1),
                     {k: mx.concatenate([x.extras[k] for x in xs], axis=1) for k in xs[0].extras})
    return mx.concatenate(xs, axis=1)


def positions(x: mx.array | Carry, start: int, stop: int | None = None) -> mx.array | Carry:
    """Positions [start, stop) of one request's input or output (axis 1)."""
    if isinstance(x, Carry):
        return Carry(x.h[:, start:stop], {k: v[:, start:stop] for k, v in x.extras.items()})
    return x[:, start:stop]


class EveryPosition:
    """How a stage's input or output is cut and joined by position when every tensor in it holds one
    entry per position (all boundaries but DeepSeek-V4.1's: hyper_streams.GroupedParts): along axis 1.
    The replay of a rollback cuts and joins inputs and outputs with it (rewind.py)."""

    def positions(self, x: mx.array | Carry, at: int, start: int, stop: int | None = None) -> mx.array | Carry:
        """Positions [start, stop) of `x`, whose first position is `at`."""
        return positions(x, start, stop)

    def join(self, xs: list, at: int) -> mx.array | Carry:
        """Inputs or outputs of consecutive positions from `at` as one."""
        return join(xs)
