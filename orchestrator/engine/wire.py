"""The stage transport's wire format: a versioned HMAC handshake, then binary frames.

A frame is a fixed 36-byte header (magic, version, kind, dtype, flags, shape, request id,
KV position, payload length) followed by raw tensor bytes or a small JSON document.
No pickle: everything a peer sends is parsed by hand and bounded before it is trusted.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import json
import math
import os
import struct
from dataclasses import dataclass, field
from typing import Any

MAGIC = b"PS"
VERSION = 2  # 2: the SOLO flag
HEADER = struct.Struct("<2sBBBBBBQI3II")  # magic ver kind dtype flags ndim pad rid pos shape[3] len
HEADER_SIZE = HEADER.size
MAX_JSON_BYTES = 64 * 1024
MAX_GROUP = 256  # frames in one micro-batch


class FrameError(ValueError):
    """A peer sent something that is not a valid frame; the connection must be closed."""


class Kind(enum.IntEnum):
    """What a frame means."""

    OPEN = 1      # a request starts: JSON sampling parameters; travels down the chain
    FORWARD = 2   # token ids (to stage 0) or hidden states (between stages)
    RESULT = 3    # last stage -> coordinator: sampled token id (+ log-probs as JSON)
    CLOSE = 4     # a request ends: free its KV caches; travels down the chain
    PING = 5      # liveness probe, answered by PONG carrying JSON stats
    PONG = 6
    ERROR = 7     # stage -> coordinator: JSON {"message": ...} about a request
    RESET = 8     # coordinator -> stage: drop every request's state
    ROUTE = 9     # coordinator -> stages: JSON {"stages": [address, ...]}, a stage moved (engine/routes.py)


class DType(enum.IntEnum):
    """Element type of a tensor payload (NONE: JSON or empty payload)."""

    NONE = 0
    INT32 = 1
    FLOAT32 = 2
    BFLOAT16 = 3
    FLOAT16 = 4

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return {DType.NONE: 1, DType.INT32: 4, DType.FLOAT32: 4, DType.BFLOAT16: 2, DType.FLOAT16: 2}[self]


class Flag(enum.IntFlag):
    """Per-frame flags."""

    NONE = 0
    SAMPLE = 1  # the last stage samples a token from this frame's final position
    MORE = 2    # another frame of the same micro-batch follows
    SOLO = 4    # no other work is in flight: a stage may use every core of its host


@dataclass(frozen=True)
class Frame:
    """One decoded frame. `payload` is raw bytes; tensors are shaped by `shape`."""

    kind: Kind
    request_id: int = 0
    position: int = 0
    dtype: DType = DType.NONE
    shape: tuple[int, ...] = ()
    flags: Flag = Flag.NONE
    payload: bytes = field(default=b"", repr=False)

    def json(self) -> Any:
        """The payload parsed as JSON (for OPEN, PONG, ERROR, RESULT)."""
        try:
            return json.loads(self.payload.decode())
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # RecursionError: deeply nested
            raise FrameError(f"{self.kind.name} frame payload is not JSON: {exc}") from None


def json_frame(kind: Kind, obj: Any, request_id: int = 0, position: int = 0, flags: Flag = Flag.NONE) -> Frame:
    """A frame whose payload is a compact JSON document."""
    payload = json.dumps(obj, separators=(",", ":")).encode()
    if len(payload) > MAX_JSON_BYTES:
        raise FrameError(f"JSON payload of {len(payload)} bytes exceeds {MAX_JSON_BYTES}")
    return Frame(kind, request_id, position, DType.NONE, (), flags, payload)


def encode(frame: Frame) -> bytes:
    """Serialise a frame: header followed by payload."""
    shape = tuple(frame.shape) + (0,) * (3 - len(frame.shape))
    header = HEADER.pack(
        MAGIC, VERSION, int(frame.kind), int(frame.dtype), int(frame.flags), len(frame.shape), 0,
        frame.request_id, frame.position, *shape, len(frame.payload),
    )
    return header + frame.payload


def decode_header(data: bytes, max_frame_bytes: int) -> tuple[Frame, int]:
    """Validate a header; returns a payload-less Frame and the payload length to read next."""
    if len(data) != HEADER_SIZE:
        raise FrameError(f"short header ({len(data)} of {HEADER_SIZE} bytes)")
    magic, version, kind, dtype, flags, ndim, _pad, rid, pos, s0, s1, s2, length = HEADER.unpack(data)
    if magic != MAGIC:
        raise FrameError(f"bad magic {magic!r}")
    if version != VERSION:
        raise FrameError(f"unsupported wire version {version} (this build speaks {VERSION})")
    try:
        kind_e, dtype_e = Kind(kind), DType(dtype)
    except ValueError:
        raise FrameError(f"unknown frame kind {kind} or dtype {dtype}") from None
    if flags & ~int(Flag.SAMPLE | Flag.MORE | Flag.SOLO):
        raise FrameError(f"unknown flags {flags:#x}")
    if ndim > 3:
        raise FrameError(f"ndim {ndim} > 3")
    shape = (s0, s1, s2)[:ndim]
    if any(shape[i] == 0 for i in range(ndim)) or any(x != 0 for x in (s0, s1, s2)[ndim:]):
        raise FrameError(f"bad shape {(s0, s1, s2)} for ndim {ndim}")
    if length > max_frame_bytes:
        raise FrameError(f"frame of {length} bytes exceeds the {max_frame_bytes}-byte limit")
    if dtype_e is DType.NONE:
        if ndim or length > MAX_JSON_BYTES:
            raise FrameError("a frame without dtype carries at most a small JSON payload")
    elif length != math.prod(shape) * dtype_e.itemsize:
        raise FrameError(f"payload {length} bytes does not match shape {shape} of {dtype_e.name}")
    return Frame(kind_e, rid, pos, dtype_e, shape, Flag(flags)), length


# --- handshake -------------------------------------------------------------------------
# server -> client: b"PSHS" ver(u16) server_nonce(32)
# client -> server: b"PSHC" ver(u16) role_len(u8) role client_nonce(32) mac(32)
# server -> client: b"PSOK" mac(32)       (or the connection is closed)
# Each side proves the secret over both nonces, so neither a replay nor a fake stage works.

HANDSHAKE_VERSION = 1
NONCE = 32
MAX_ROLE = 64


class HandshakeError(ConnectionError):
    """The peer did not prove knowledge of the cluster secret, or spoke another version."""


def new_nonce() -> bytes:
    """A fresh random nonce."""
    return os.urandom(NONCE)


def _mac(secret: bytes, label: bytes, *parts: bytes) -> bytes:
    return hmac.new(secret, label + b"".join(parts), hashlib.sha256).digest()


def server_hello(nonce: bytes) -> bytes:
    """The server's opening message."""
    return b"PSHS" + struct.pack("<H", HANDSHAKE_VERSION) + nonce


def parse_server_hello(data: bytes) -> bytes:
    """The server nonce from its hello; raises HandshakeError on anything else."""
    if len(data) != 6 + NONCE or data[:4] != b"PSHS":
        raise HandshakeError("peer is not a pipeserve stage")
    (version,) = struct.unpack("<H", data[4:6])
    if version != HANDSHAKE_VERSION:
        raise HandshakeError(f"peer speaks handshake version {version}, this build {HANDSHAKE_VERSION}")
    return data[6:]


def client_proof(secret: bytes, role: str, server_nonce: bytes, client_nonce: bytes) -> bytes:
    """The client's reply proving the secret, naming its role ("coordinator", "stage-0", ...)."""
    role_b = role.encode()
    if not 0 < len(role_b) <= MAX_ROLE:
        raise ValueError("role must be 1..64 bytes")
    mac = _mac(secret, b"client", server_nonce, client_nonce, role_b)
    return b"PSHC" + struct.pack("<HB", HANDSHAKE_VERSION, len(role_b)) + role_b + client_nonce + mac


def verify_client(secret: bytes, server_nonce: bytes, head: bytes, rest: bytes) -> tuple[str, bytes]:
    """Check the client's proof (`head` = first 7 bytes, `rest` = the remainder); returns (role, client nonce)."""
    if len(head) != 7 or head[:4] != b"PSHC":
        raise HandshakeError("no handshake: the peer did not start with PSHC")
    version, role_len = struct.unpack("<HB", head[4:7])
    if version != HANDSHAKE_VERSION:
        raise HandshakeError(f"handshake version {version} unsupported")
    if len(rest) != role_len + NONCE + 32 or not 0 < role_len <= MAX_ROLE:
        raise HandshakeError("malformed handshake")
    role_b, client_nonce, mac = rest[:role_len], rest[role_len:role_len + NONCE], rest[role_len + NONCE:]
    if not hmac.compare_digest(mac, _mac(secret, b"client", server_nonce, client_nonce, role_b)):
        raise HandshakeError("wrong cluster secret")
    try:
        return role_b.decode(), client_nonce
    except UnicodeDecodeError:
        raise HandshakeError("role is not UTF-8") from None


def rest_length(head: bytes) -> int:
    """How many bytes follow the 7-byte client head."""
    return head[6] + NONCE + 32 if len(head) == 7 else 0


def server_proof(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    """The server's acceptance, proving it knows the secret too."""
    return b"PSOK" + _mac(secret, b"server", client_nonce, server_nonce)


def verify_server(secret: bytes, server_nonce: bytes, client_nonce: bytes, data: bytes) -> None:
    """Check the server's acceptance; raises HandshakeError if it is not genuine."""
    if len(data) != 36 or data[:4] != b"PSOK":
        raise HandshakeError("stage refused the handshake (wrong secret or version?)")
    if not hmac.compare_digest(data[4:], _mac(secret, b"server", client_nonce, server_nonce)):
        raise HandshakeError("stage failed to prove the cluster secret")
