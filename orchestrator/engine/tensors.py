"""Convert between frames and mlx arrays, checking every dimension a peer claims.

Between stages a FORWARD frame carries the hidden state alone, or, for a family whose layers
need more than the hidden state downstream (Gemma 4's per-layer inputs), a NAMED frame: the
hidden state as "h" and each extra tensor under the name the stage model declares: in the
stage's dtype and shaped [1, L, ...] like the hidden state (a plain shape), or with a shape and
dtype of its own (`Expected`: DeepSeek-V4.1's compressed K/V entries, top-k indices, candidate
flags). A tensor with no elements is not sent; the receiver takes zeros of its expected shape.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Mapping
from typing import NamedTuple, Union

import mlx.core as mx

from orchestrator.engine.wire import DType, Flag, Frame, FrameError, Kind, Tensor, named_payload, named_tensors

_FLOATS = {mx.float32: DType.FLOAT32, mx.bfloat16: DType.BFLOAT16, mx.float16: DType.FLOAT16}
_TO_WIRE = {**_FLOATS, mx.int32: DType.INT32, mx.bool_: DType.BOOL}
_FROM_WIRE = {v: k for k, v in _TO_WIRE.items()}
# The buffer-protocol format each wire dtype is read as (both 16-bit floats as their bits, then viewed:
# memoryview knows no bfloat16 and cannot cast to float16). Reading a payload through a memoryview
# is half the cost of a numpy array in between, on every hop of every step.
_FORMAT = {DType.INT32: "i", DType.FLOAT32: "f", DType.BFLOAT16: "H", DType.FLOAT16: "H", DType.BOOL: "?"}
_VIEW = {DType.BFLOAT16: mx.bfloat16, DType.FLOAT16: mx.float16}


class Expected(NamedTuple):
    """An extra tensor with its own shape (after the batch dimension of 1) and dtype."""

    shape: tuple[int, ...]
    dtype: mx.Dtype


# What a stage declares of each extra tensor: a shape after [1, L] in its own dtype, or `Expected`.
ExtraSpec = Union[tuple[int, ...], Expected]


def tokens_frame(request_id: int, position: int, tokens: list[int], flags: Flag = Flag.NONE) -> Frame:
    """FORWARD frame of token ids for stage 0."""
    payload = struct.pack(f"<{len(tokens)}i", *tokens)
    return Frame(Kind.FORWARD, request_id, position, DType.INT32, (len(tokens),), flags, payload)


def _wire_dtype(a: mx.array) -> DType:
    if a.dtype not in _TO_WIRE:
        raise ValueError(f"no wire type for {a.dtype}")
    return _TO_WIRE[a.dtype]


def _wire(a: mx.array) -> tuple[DType, bytes]:
    dtype = _wire_dtype(a)
    # mlx exports bfloat16 buffers too (their bytes are all the wire needs); a uint16 view first
    # would be one more graph evaluation per hop (20-50 µs after the step, measured)
    view = memoryview(a)
    # A row-major array is sent as a view of its own memory (transport.send_parts); any other is copied in C order.
    return dtype, view.cast("B") if view.c_contiguous else view.tobytes()


def to_frame(request_id: int, position: int, h: mx.array, flags: Flag = Flag.NONE,
             extras: Mapping[str, mx.array] | None = None) -> Frame:
    """FORWARD frame carrying hidden states [1, L, H] in the dtype the layer produced.

    With `extras` (name -> [1, L, ...] array) a NAMED frame carrying "h" and each of them;
    without, the one-tensor frame, unchanged.
    """
    dtype, data = _wire(h)
    if not extras:
        return Frame(Kind.FORWARD, request_id, position, dtype, tuple(h.shape), flags, data)
    tensors = {"h": Tensor(dtype, tuple(h.shape), data)}
    for name, a in extras.items():
        if name == "h":
            raise ValueError("the extra tensors of a frame cannot be named h")
        if not a.size:
            continue  # nothing to send: the receiver takes zeros of the shape it expects
        a_dtype, a_data = _wire(a)
        tensors[name] = Tensor(a_dtype, tuple(a.shape), a_data)
    return Frame(Kind.FORWARD, request_id, position, DType.NONE, (), flags | Flag.NAMED, named_payload(tensors))


def framed_ahead(request_id: int, position: int, h: mx.array, flags: Flag = Flag.NONE) -> Frame:
    """`to_frame` of a hidden state not evaluated yet: its payload is the row-major array itself, to be
    evaluated with the step (pass `frame.payload` to `mx.eval`) and then sent as its own memory.

    Right after a step's evaluation every line of Python runs several times slower (the layers'
    weights evicted it from the caches): framing there was a fifth of a stage boundary, framing
    while the graph is built costs next to nothing (docs/benchmark.md)."""
    return Frame(Kind.FORWARD, request_id, position, _wire_dtype(h), tuple(h.shape), flags, mx.contiguous(h))


def _array(t: Tensor | Frame) -> mx.array:
    data = t.payload if isinstance(t, Frame) else t.data
    arr = mx.array(memoryview(data).cast(_FORMAT[t.dtype], t.shape))
    view = _VIEW.get(t.dtype)
    return arr if view is None else arr.view(view)


def from_frame_with(frame: Frame, *, hidden: int | tuple[int, ...], dtype: mx.Dtype,
                    extras: Mapping[str, ExtraSpec] | Callable[[int], Mapping[str, ExtraSpec]]
                    ) -> tuple[mx.array, dict[str, mx.array]]:
    """A non-first stage's input: the hidden state [1, L, H] and the extra tensors it declares.

    `extras` maps each name to the shape it must have after [1, L] (the same L as the hidden
    state's), in `dtype`, or to an `Expected` shape and dtype; or it is a function of L giving
    that mapping (shapes that depend on the step's length). A family without extras takes the
    one-tensor frame; with extras, a NAMED frame carrying exactly "h" and those names (but the
    empty ones). `hidden`: H, or the hidden state's whole shape after [1, L] (DeepSeek-V4.1's
    residual streams, [hc, H]). Raises ValueError (FrameError) otherwise.
    """
    if not extras:  # (a function of L always declares some)
        if frame.flags & Flag.NAMED:
            raise ValueError("this stage takes the hidden state alone, not a NAMED frame")
        width = hidden if isinstance(hidden, int) else hidden[-1]
        if not isinstance(hidden, int) and len(hidden) != 1:
            raise ValueError(f"a hidden state of shape {tuple(hidden)} after [1, L] crosses in a NAMED frame")
        return from_frame(frame, first=False, hidden=width, vocab=0, dtype=dtype), {}
    if not frame.flags & Flag.NAMED:
        raise ValueError(f"this stage takes a NAMED frame of h and {', '.join(extras)}")
    tensors = named_tensors(frame)
    if "h" not in tensors:
        raise FrameError(f"expected the hidden state h; got {', '.join(tensors)}")
    h = tensors["h"]
    x = _hidden(h, hidden, dtype)
    wanted = {name: spec if isinstance(spec, Expected) else Expected((x.shape[1], *spec), dtype)
              for name, spec in (extras(x.shape[1]) if callable(extras) else extras).items()}
    sent = {name for name, spec in wanted.items() if math.prod(spec.shape)}
    if set(tensors) != {"h", *sent}:
        raise FrameError(f"expected tensors h, {', '.join(sent)}; got {', '.join(tensors)}")
    out = {}
    for name, spec in wanted.items():
        if name not in sent:
            out[name] = mx.zeros((1, *spec.shape), spec.dtype)
            continue
        t = tensors[name]
        if _FROM_WIRE.get(t.dtype) != spec.dtype or t.shape != (1, *spec.shape):
            raise FrameError(f"expected {name} [1, {', '.join(map(str, spec.shape))}] in {spec.dtype}, "
                             f"got {t.dtype.name} {t.shape}")
        out[name] = _array(t)
    return x, out


def _hidden(h: Tensor, hidden: int | tuple[int, ...], dtype: mx.Dtype) -> mx.array:
    """The hidden state of a NAMED frame, [1, L, *hidden] in `dtype`."""
    rest = (hidden,) if isinstance(hidden, int) else tuple(hidden)
    if h.dtype not in _FLOATS.values() or len(h.shape) != 2 + len(rest) or h.shape[0] != 1 or h.shape[2:] != rest:
        raise ValueError(f"expected hidden states [1, L, {', '.join(map(str, rest))}], got {h.dtype.name} {h.shape}")
    if _FROM_WIRE[h.dtype] != dtype:
        raise ValueError(f"hidden states in {h.dtype.name}, this model runs {dtype}")
    return _array(h)


def from_frame(frame: Frame, *, first: bool, hidden: int, vocab: int, dtype: mx.Dtype) -> mx.array:
    """The frame's tensor: [1, L] token ids on the first stage, [1, L, H] hidden elsewhere.

    Raises ValueError when the frame does not fit this stage (wrong kind of input, width,
    dtype, or a token id outside the vocabulary). `dtype` is what the stage's first layer
    takes, which is what the upstream layer produces (`StageModel.dtype`).
    """
    if first:
        if frame.dtype is not DType.INT32 or len(frame.shape) != 1:
            raise ValueError("the first stage takes a 1-D int32 frame of token ids")
        ids = memoryview(frame.payload).cast("i")
        if len(ids) and (min(ids) < 0 or max(ids) >= vocab):
            raise ValueError(f"token id outside the vocabulary (0..{vocab - 1})")
        return mx.array(ids)[None]
    if frame.dtype not in _FLOATS.values() or len(frame.shape) != 3 or frame.shape[0] != 1 or frame.shape[2] != hidden:
        raise ValueError(f"expected hidden states [1, L, {hidden}], got {frame.dtype.name} {frame.shape}")
    if _FROM_WIRE[frame.dtype] != dtype:
        raise ValueError(f"hidden states in {frame.dtype.name}, this model runs {dtype}")
    return _array(frame)  # a Frame has the dtype, shape and bytes a Tensor would
