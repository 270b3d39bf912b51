"""Frames to arrays and back: the one-tensor frame and the NAMED frame of several tensors."""

from __future__ import annotations

import socket

import mlx.core as mx
import pytest

from orchestrator.engine import wire
from orchestrator.engine.tensors import Expected, framed_ahead, from_frame, from_frame_with, to_frame
from orchestrator.engine.transport import Connection
from orchestrator.engine.wire import DType, Flag, FrameError, Kind, json_frame

H, P = 8, 4


def _arr(shape, dtype=mx.bfloat16):
    return (mx.arange(1, 1 + int(mx.prod(mx.array(shape)).item())).reshape(shape) / 7).astype(dtype)


def test_hidden_alone_is_the_one_tensor_frame():
    h = _arr((1, 3, H))
    f = to_frame(1, 0, h, Flag.SAMPLE)
    assert (f.dtype, f.shape, f.flags, len(f.payload)) == (DType.BFLOAT16, (1, 3, H), Flag.SAMPLE, 3 * H * 2)
    x, extras = from_frame_with(f, hidden=H, dtype=mx.bfloat16, extras={})
    assert extras == {} and mx.array_equal(x, h).item() and x.dtype == mx.bfloat16
    x, _ = from_frame_with(f, hidden=(H,), dtype=mx.bfloat16, extras={})  # a stage's hidden_shape
    assert mx.array_equal(x, h).item()


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16, mx.float32])
def test_named_roundtrip_is_bit_exact(dtype):
    h, ple = _arr((1, 3, H), dtype), _arr((1, 3, 2, P), dtype)
    f = to_frame(4, 9, h, Flag.SOLO, {"per_layer": ple})
    assert f.flags == Flag.SOLO | Flag.NAMED and f.dtype is DType.NONE
    x, extras = from_frame_with(f, hidden=H, dtype=dtype, extras={"per_layer": (2, P)})
    assert mx.array_equal(x, h).item() and mx.array_equal(extras["per_layer"], ple).item()
    assert extras["per_layer"].dtype == dtype


def _streams_extras(length: int) -> dict:
    """DeepSeek-V4.1-like: streams as h [1, L, 2, H], a float32 mix, int32 picks, bool flags, entries
    whose count is not L (one here; none when the step closed no group)."""
    return {"pre_mix": Expected((length, 2), mx.float32), "topk_idx": Expected((length, 3), mx.int32),
            "candidates": Expected((length, 2), mx.bool_), "compress_kv": Expected((1, P), mx.bfloat16),
            "index_k": Expected((0, P), mx.bfloat16)}


def test_extras_of_their_own_dtype_and_length_roundtrip_and_empty_ones_are_not_sent():
    h = _arr((1, 3, 2, H))
    sent = {"pre_mix": _arr((1, 3, 2), mx.float32), "topk_idx": mx.array([[[0, 2, -1], [1, 0, 2], [3, 1, 0]]]),
            "candidates": mx.array([[[True, False], [False, True], [True, True]]]),
            "compress_kv": _arr((1, 1, P)), "index_k": mx.zeros((1, 0, P), mx.bfloat16)}
    f = to_frame(2, 40, h, extras=sent)
    assert set(wire.named_tensors(f)) == {"h", "pre_mix", "topk_idx", "candidates", "compress_kv"}
    x, extras = from_frame_with(f, hidden=(2, H), dtype=mx.bfloat16, extras=_streams_extras)
    assert mx.array_equal(x, h).item() and set(extras) == set(sent)
    for name, a in sent.items():
        assert extras[name].dtype == a.dtype and extras[name].shape == a.shape
        assert mx.array_equal(extras[name], a).item(), name


def test_an_extra_the_step_should_not_have_sent_or_of_another_dtype_is_refused():
    h = _arr((1, 3, 2, H))
    base = {"pre_mix": _arr((1, 3, 2), mx.float32), "topk_idx": mx.zeros((1, 3, 3), mx.int32),
            "candidates": mx.zeros((1, 3, 2), mx.bool_), "compress_kv": _arr((1, 1, P))}
    with pytest.raises(FrameError, match="got h, pre_mix, topk_idx, candidates, compress_kv, index_k"):
        from_frame_with(to_frame(1, 0, h, extras={**base, "index_k": _arr((1, 1, P))}), hidden=(2, H),
                        dtype=mx.bfloat16, extras=_streams_extras)
    with pytest.raises(FrameError, match=r"expected topk_idx \[1, 3, 3\] in mlx.core.int32, got FLOAT32"):
        from_frame_with(to_frame(1, 0, h, extras={**base, "topk_idx": mx.zeros((1, 3, 3))}), hidden=(2, H),
                        dtype=mx.bfloat16, extras=_streams_extras)
    with pytest.raises(ValueError, match=r"expected hidden states \[1, L, 2, 8\]"):
        from_frame_with(to_frame(1, 0, _arr((1, 3, H)), extras=base), hidden=(2, H), dtype=mx.bfloat16,
                        extras=_streams_extras)


def test_extras_cannot_be_named_h():
    with pytest.raises(ValueError, match="cannot be named h"):
        to_frame(1, 0, _arr((1, 1, H)), extras={"h": _arr((1, 1, H))})


GOOD = {"per_layer": (2, P)}


@pytest.mark.parametrize("frame,extras,message", [
    pytest.param(to_frame(1, 0, _arr((1, 2, H))), GOOD, "takes a NAMED frame of h and per_layer", id="plain-for-named"),
    pytest.param(to_frame(1, 0, _arr((1, 2, H)), extras={"per_layer": _arr((1, 2, 2, P))}), {},
                 "takes the hidden state alone", id="named-for-plain"),
    pytest.param(to_frame(1, 0, _arr((1, 2, H)), extras={"other": _arr((1, 2, 2, P))}), GOOD,
                 "expected tensors h, per_layer; got h, other", id="wrong-name"),
    pytest.param(to_frame(1, 0, _arr((1, 2, H)), extras={"per_layer": _arr((1, 3, 2, P))}), GOOD,
                 r"expected per_layer \[1, 2, 2, 4\] in mlx.core.bfloat16, got BFLOAT16 \(1, 3, 2, 4\)", id="other-L"),
    pytest.param(to_frame(1, 0, _arr((1, 2, H)), extras={"per_layer": _arr((1, 2, 3, P))}), GOOD,
                 r"got BFLOAT16 \(1, 2, 3, 4\)", id="other-width"),
    pytest.param(to_frame(1, 0, _arr((1, 2, H)), extras={"per_layer": _arr((1, 2, 2, P), mx.float32)}), GOOD,
                 r"got FLOAT32", id="other-dtype"),
    pytest.param(to_frame(1, 0, _arr((1, 2, H + 1)), extras={"per_layer": _arr((1, 2, 2, P))}), GOOD,
                 r"expected hidden states \[1, L, 8\]", id="other-hidden"),
    pytest.param(to_frame(1, 0, _arr((1, 2, H), mx.float32), extras={"per_layer": _arr((1, 2, 2, P))}), GOOD,
                 r"hidden states in FLOAT32", id="hidden-dtype"),
])
def test_named_frame_that_does_not_fit_is_refused(frame, extras, message):
    with pytest.raises(ValueError, match=message):
        from_frame_with(frame, hidden=H, dtype=mx.bfloat16, extras=extras)


def test_malformed_named_payload_is_a_frame_error():
    f = to_frame(1, 0, _arr((1, 2, H)), extras={"per_layer": _arr((1, 2, 2, P))})
    bad = wire.Frame(f.kind, f.request_id, f.position, f.dtype, f.shape, f.flags, f.payload[:-1])
    with pytest.raises(FrameError, match="bytes do not match"):
        from_frame_with(bad, hidden=H, dtype=mx.bfloat16, extras=GOOD)


def test_first_stage_still_takes_token_ids_only():
    f = to_frame(1, 0, _arr((1, 2, H)), extras={"per_layer": _arr((1, 2, 2, P))})
    with pytest.raises(ValueError, match="1-D int32 frame of token ids"):
        from_frame(f, first=True, hidden=H, vocab=10, dtype=mx.bfloat16)


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16, mx.float32])
def test_a_frame_framed_before_the_evaluation_crosses_a_socket_as_to_frame_would(dtype):
    # A real connection pair; the hidden state is lazy when framed and laid out column-major (a
    # transpose): what is sent must still be its row-major bytes, as `to_frame` of the evaluated array.
    a, b = socket.socketpair()
    sender, receiver = Connection(a, "peer", "stage-0", 1 << 20), Connection(b, "peer", "stage-1", 1 << 20)
    try:
        base = _arr((1, H, 3), dtype)
        h = base.transpose(0, 2, 1) * 2  # lazy
        f = framed_ahead(4, 9, h, Flag.SAMPLE)
        mx.eval(f.payload)
        sender.send_group([f, json_frame(Kind.ERROR, {"message": "after"}, request_id=4)])
        got = receiver.recv_group()
    finally:
        sender.close()
        receiver.close()
    expected = to_frame(4, 9, base.transpose(0, 2, 1) * 2, Flag.SAMPLE)
    assert got[0]._replace(flags=got[0].flags & ~Flag.MORE, payload=b"") == expected._replace(payload=b"")
    assert got[0].payload == bytes(expected.payload) and len(got[0].payload) == 3 * H * h.itemsize
    assert got[1].json() == {"message": "after"}  # the next frame starts where the payload ended
    x, _ = from_frame_with(got[0], hidden=H, dtype=dtype, extras={})
    assert mx.array_equal(x, h).item()

