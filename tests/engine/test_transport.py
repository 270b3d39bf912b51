"""Framed sends (transport.send_parts): a gathered write the kernel takes in parts goes out whole."""

from __future__ import annotations

import socket
import threading

import mlx.core as mx

from orchestrator.engine import wire
from orchestrator.engine.tensors import framed_ahead, to_frame
from orchestrator.engine.transport import Connection, send_parts


def test_a_payload_longer_than_the_socket_buffer_is_sent_whole():
    # sendmsg sends part of a large gathered write (a socket with a timeout is non-blocking underneath, so
    # each call sends what the buffer takes): the rest follows, from mid-array
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    a.settimeout(30)
    h = (mx.arange(64 * 1024).reshape(1, 64, 1024) / 7).astype(mx.bfloat16)  # 128 KiB
    f = framed_ahead(1, 0, h)
    mx.eval(f.payload)
    received = []
    reader = threading.Thread(target=lambda: received.append(Connection(b, "p", "stage-1", 1 << 20).recv()))
    reader.start()
    try:
        sent = send_parts(a, [wire.header(f), f.payload])
        reader.join(timeout=30)
    finally:
        a.close()
        b.close()
    assert sent == wire.HEADER_SIZE + h.nbytes
    assert received and received[0].payload == bytes(to_frame(1, 0, h).payload)


def test_frames_of_a_group_follow_each_other_whole_through_partial_sends():
    # several frames, array and byte payloads, through a buffer smaller than any of them
    a, b = socket.socketpair()
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    a.settimeout(30)
    arrays = [(mx.arange(n * 1024).reshape(1, n, 1024) / 3).astype(mx.float32) for n in (8, 3)]
    frames = [framed_ahead(1, 0, arrays[0]), wire.Frame(wire.Kind.RESULT, 2, 5, payload=b"x" * 9000),
              framed_ahead(3, 7, arrays[1])]
    mx.eval([f.payload for f in frames if not isinstance(f.payload, bytes)])
    got: list = []
    reader = threading.Thread(target=lambda: got.extend(Connection(b, "p", "stage-1", 1 << 20).recv_group()))
    reader.start()
    try:
        Connection(a, "p", "stage-0", 1 << 20).send_group(frames)
        reader.join(timeout=30)
    finally:
        a.close()
        b.close()
    assert [(f.kind, f.request_id, f.position) for f in got] == [(f.kind, f.request_id, f.position) for f in frames]
    assert got[0].payload == bytes(to_frame(1, 0, arrays[0]).payload) and got[1].payload == b"x" * 9000
    assert got[2].payload == bytes(to_frame(3, 7, arrays[1]).payload)
