"""Convert between frames and mlx arrays, checking every dimension a peer claims."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from .wire import DType, Flag, Frame, Kind

_TO_WIRE = {mx.float32: DType.FLOAT32, mx.bfloat16: DType.BFLOAT16, mx.float16: DType.FLOAT16}
_FROM_WIRE = {DType.FLOAT32: mx.float32, DType.BFLOAT16: mx.bfloat16, DType.FLOAT16: mx.float16}
_NUMPY = {DType.INT32: np.int32, DType.FLOAT32: np.float32, DType.BFLOAT16: np.uint16, DType.FLOAT16: np.float16}


def tokens_frame(request_id: int, position: int, tokens: list[int], flags: Flag = Flag.NONE) -> Frame:
    """FORWARD frame of token ids for stage 0."""
    payload = np.asarray(tokens, dtype=np.int32).tobytes()
    return Frame(Kind.FORWARD, request_id, position, DType.INT32, (len(tokens),), flags, payload)


def to_frame(request_id: int, position: int, h: mx.array, flags: Flag = Flag.NONE) -> Frame:
    """FORWARD frame carrying hidden states [1, L, H] in the dtype the layer produced."""
    dtype = _TO_WIRE[h.dtype]
    raw = h.view(mx.uint16) if dtype is DType.BFLOAT16 else h  # numpy has no bfloat16
    return Frame(Kind.FORWARD, request_id, position, dtype, tuple(h.shape), flags, np.array(raw, copy=False).tobytes())


def from_frame(frame: Frame, *, first: bool, hidden: int, vocab: int, dtype: mx.Dtype) -> mx.array:
    """The frame's tensor: [1, L] token ids on the first stage, [1, L, H] hidden elsewhere.

    Raises ValueError when the frame does not fit this stage (wrong kind of input, width,
    dtype, or a token id outside the vocabulary). `dtype` is what the stage's first layer
    takes, which is what the upstream layer produces (`StageModel.dtype`).
    """
    if first:
        if frame.dtype is not DType.INT32 or len(frame.shape) != 1:
            raise ValueError("the first stage takes a 1-D int32 frame of token ids")
        ids = np.frombuffer(frame.payload, dtype=np.int32)
        if ids.size and (ids.min() < 0 or ids.max() >= vocab):
            raise ValueError(f"token id outside the vocabulary (0..{vocab - 1})")
        return mx.array(ids)[None]
    if frame.dtype not in _FROM_WIRE or len(frame.shape) != 3 or frame.shape[0] != 1 or frame.shape[2] != hidden:
        raise ValueError(f"expected hidden states [1, L, {hidden}], got {frame.dtype.name} {frame.shape}")
    if _FROM_WIRE[frame.dtype] != dtype:
        raise ValueError(f"hidden states in {frame.dtype.name}, this model runs {dtype}")
    arr = mx.array(np.frombuffer(frame.payload, dtype=_NUMPY[frame.dtype]).reshape(frame.shape))
    return arr.view(mx.bfloat16) if frame.dtype is DType.BFLOAT16 else arr
