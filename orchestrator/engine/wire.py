"""The stage transport's wire format: a versioned HMAC handshake, then binary frames.

A frame is a fixed 36-byte header (magic, version, kind, dtype, flags, shape, request id,
KV position, payload length) followed by raw tensor bytes or a small JSON document. A
FORWARD frame with the NAMED flag carries several named tensors instead of one (a family
whose layers pass more than the hidden state across a stage boundary): its payload is a
directory (name, dtype, shape of each) followed by the tensors' bytes, every field bounded
as the header's are. The one-tensor frame stays as it was, byte for byte.
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
from typing import Any, NamedTuple

MAGIC = b"PS"
VERSION = 5  # 2: the SOLO flag; 3: CACHE frames (the prompt cache); 4: NAMED frames (several tensors), DRAFT
# frames and the RUN flag (speculation); 5: BOOL tensors (DeepSeek-V4.1's candidate blocks)
HEADER = struct.Struct("<2sBBBBBBQI3II")  # magic ver kind dtype flags ndim pad rid pos shape[3] len
HEADER_SIZE = HEADER.size
MAX_JSON_BYTES = 64 * 1024
MAX_GROUP = 256  # frames in one micro-batch
MAX_TENSORS = 8  # tensors in one NAMED frame
MAX_NAME = 16    # bytes of a tensor's name
MAX_NAMED_NDIM = 4  # K/V crosses as [B, heads, L, head_dim]
NAMED_ENTRY = struct.Struct("<BB")  # dtype ndim (after the name), then ndim u32 dimensions


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
    ROUTE = 9     # coordinator -> stages: JSON {"stages": [address, ...]}, a stage moved (engine/stage_address.py)
    CACHE = 10    # prompt cache (engine/stage/prompt_cache.py): coordinator -> stages down the chain, a checkpoint
    #               or evictions; stage -> coordinator, the acknowledgement of a stored entry
    DRAFT = 11    # coordinator -> stages: JSON {"tokens": [...]}, the drafted tokens the request's next FORWARD
    #               chunk carries after its last accepted token (engine/stage/speculate.py); travels down the chain


class DType(enum.IntEnum):
    """Element type of a tensor payload (NONE: JSON or empty payload)."""

    NONE = 0
    INT32 = 1
    FLOAT32 = 2
    BFLOAT16 = 3
    FLOAT16 = 4
    BOOL = 5  # one byte per element, 0 or 1

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return {DType.NONE: 1, DType.INT32: 4, DType.FLOAT32: 4, DType.BFLOAT16: 2, DType.FLOAT16: 2,
                DType.BOOL: 1}[self]


class Flag(enum.IntFlag):
    """Per-frame flags."""

    NONE = 0
    SAMPLE = 1  # the last stage samples a token from this frame's final position
    MORE = 2    # another frame of the same micro-batch follows
    SOLO = 4    # no other work is in flight: a stage may use every core of its host
    NAMED = 8   # a FORWARD frame whose payload is several named tensors (`named_payload`)
    RUN = 16    # a RESULT of a verification pass that another RESULT of the same pass follows
    BATCH = 32  # a prefill chunk a stage may run in one batched forward with its group's other BATCH chunks

    # IntFlag's own & and | build their result through the enum machinery, microseconds each and
    # several per frame of every step: these look it up (the table holds every valid combination).
    def __and__(self, other: object) -> "Flag":
        return _flag(int(self) & int(other)) if isinstance(other, int) else NotImplemented

    def __or__(self, other: object) -> "Flag":
        return _flag(int(self) | int(other)) if isinstance(other, int) else NotImplemented

    __rand__, __ror__ = __and__, __or__


def _flag(value: int) -> Flag:
    found = _FLAG_OF.get(value)
    return found if found is not None else enum.IntFlag.__new__(Flag, value)  # unknown bits: IntFlag's own


_FLAGS = Flag(sum(int(f) for f in (Flag.SAMPLE, Flag.MORE, Flag.SOLO, Flag.NAMED, Flag.RUN, Flag.BATCH)))
# Table lookups for the header's enums: an Enum call by value costs microseconds per frame.
_KIND_OF = {int(k): k for k in Kind}
_DTYPE_OF = {int(d): d for d in DType}
_FLAG_OF = {v: Flag(v) for v in range(int(_FLAGS) + 1) if not v & ~int(_FLAGS)}
_ITEMSIZE = {d: d.itemsize for d in DType}
_NAMED_BIT, _MORE_BIT = int(Flag.NAMED), int(Flag.MORE)


class Frame(NamedTuple):
    """One decoded frame. `payload` is raw bytes; tensors are shaped by `shape`.

    A named tuple rather than a frozen dataclass: every frame of every step is built at least
    once on each side of a hop, and a tuple is built several times faster (the per-token path).
    """

    kind: Kind
    request_id: int = 0
    position: int = 0
    dtype: DType = DType.NONE
    shape: tuple[int, ...] = ()
    flags: Flag = Flag.NONE
    # or, for a tensor this process computed, a flat byte view of it or the row-major mlx array itself
    # (`tensors.framed_ahead`): sent without a copy, its length `payload_size`
    payload: bytes = b""

    def __repr__(self) -> str:
        return (f"Frame(kind={self.kind!r}, request_id={self.request_id}, position={self.position}, "
                f"dtype={self.dtype!r}, shape={self.shape}, flags={self.flags!r}, "
                f"payload=<{payload_size(self.payload)} bytes>)")

    def json(self) -> Any:
        """The payload parsed as JSON (for OPEN, PONG, ERROR, RESULT)."""
        try:
            return json.loads(self.payload.decode())
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # RecursionError: deeply nested
            raise FrameError(f"{self.kind.name} frame payload is not JSON: {exc}") from None

    def with_more(self, more: bool) -> "Frame":
        """This frame with the MORE flag set or cleared (itself when it already is)."""
        flags = int(self.flags)
        if bool(flags & _MORE_BIT) == more:
            return self
        return self._replace(flags=_FLAG_OF[flags ^ _MORE_BIT])


def json_frame(kind: Kind, obj: Any, request_id: int = 0, position: int = 0, flags: Flag = Flag.NONE) -> Frame:
    """A frame whose payload is a compact JSON document."""
    payload = json.dumps(obj, separators=(",", ":")).encode()
    if len(payload) > MAX_JSON_BYTES:
        raise FrameError(f"JSON payload of {len(payload)} bytes exceeds {MAX_JSON_BYTES}")
    return Frame(kind, request_id, position, DType.NONE, (), flags, payload)


def header(frame: Frame) -> bytes:
    """A frame's 36-byte header (its payload follows it on the wire)."""
    shape = tuple(frame.shape) + (0,) * (3 - len(frame.shape))
    return HEADER.pack(
        MAGIC, VERSION, int(frame.kind), int(frame.dtype), int(frame.flags), len(frame.shape), 0,
        frame.request_id, frame.position, *shape, payload_size(frame.payload),
    )


def payload_size(payload: Any) -> int:
    """A payload's length in bytes: bytes, a byte view, or an mlx array sent as its own memory."""
    return len(payload) if isinstance(payload, (bytes, bytearray)) else payload.nbytes


def encode(frame: Frame) -> bytes:
    """Serialise a frame: header followed by payload."""
    return header(frame) + bytes(memoryview(frame.payload).cast("B"))


def decode_header(data: bytes, max_frame_bytes: int) -> tuple[Frame, int]:
    """Validate a header; returns a payload-less Frame and the payload length to read next."""
    if len(data) != HEADER_SIZE:
        raise FrameError(f"short header ({len(data)} of {HEADER_SIZE} bytes)")
    magic, version, kind, dtype, flags, ndim, _pad, rid, pos, s0, s1, s2, length = HEADER.unpack(data)
    if magic != MAGIC:
        raise FrameError(f"bad magic {magic!r}")
    if version != VERSION:
        raise FrameError(f"unsupported wire version {version} (this build speaks {VERSION})")
    kind_e, dtype_e, flags_e = _KIND_OF.get(kind), _DTYPE_OF.get(dtype), _FLAG_OF.get(flags)
    if kind_e is None or dtype_e is None:
        raise FrameError(f"unknown frame kind {kind} or dtype {dtype}")
    if flags_e is None:
        raise FrameError(f"unknown flags {flags:#x}")
    if ndim > 3:
        raise FrameError(f"ndim {ndim} > 3")
    shape = (s0, s1, s2)[:ndim]
    if 0 in shape or any((s0, s1, s2)[ndim:]):
        raise FrameError(f"bad shape {(s0, s1, s2)} for ndim {ndim}")
    if length > max_frame_bytes:
        raise FrameError(f"frame of {length} bytes exceeds the {max_frame_bytes}-byte limit")
    if flags & _NAMED_BIT:
        if kind_e is not Kind.FORWARD or dtype_e is not DType.NONE or ndim or not length:
            raise FrameError("a NAMED frame is a FORWARD frame without dtype or shape and with a payload")
    elif dtype_e is DType.NONE:
        if ndim or length > MAX_JSON_BYTES:
            raise FrameError("a frame without dtype carries at most a small JSON payload")
    elif length != math.prod(shape) * _ITEMSIZE[dtype_e]:
        raise FrameError(f"payload {length} bytes does not match shape {shape} of {dtype_e.name}")
    return Frame(kind_e, rid, pos, dtype_e, shape, flags_e), length


# --- NAMED frames: several tensors ------------------------------------------------------
# payload: count(u8), then per tensor name_len(u8) name dtype(u8) ndim(u8) dims(u32 * ndim),
# then the tensors' raw bytes in directory order, nothing after.


@dataclass(frozen=True)
class Tensor:
    """One tensor of a NAMED frame: raw bytes of `dtype` shaped by `shape`."""

    dtype: DType
    shape: tuple[int, ...]
    data: bytes = field(repr=False)


def _check_tensor(name: str, t: Tensor) -> None:
    if not 0 < len(name.encode()) <= MAX_NAME or not name.isascii() or not name.replace("_", "a").isalnum():
        raise FrameError(f"tensor name {name!r} is not 1..{MAX_NAME} ASCII letters, digits or _")
    if t.dtype is DType.NONE or not 0 < len(t.shape) <= MAX_NAMED_NDIM or any(d < 1 or d >= 2**32 for d in t.shape):
        raise FrameError(f"tensor {name}: bad dtype {t.dtype.name} or shape {t.shape} (1..{MAX_NAMED_NDIM} dims >= 1)")
    if len(t.data) != math.prod(t.shape) * t.dtype.itemsize:
        raise FrameError(f"tensor {name}: {len(t.data)} bytes do not match shape {t.shape} of {t.dtype.name}")


def named_payload(tensors: dict[str, Tensor]) -> bytes:
    """The payload of a NAMED frame carrying `tensors` (in their order); FrameError when out of bounds."""
    if not 0 < len(tensors) <= MAX_TENSORS:
        raise FrameError(f"a NAMED frame carries 1..{MAX_TENSORS} tensors, not {len(tensors)}")
    head = [bytes([len(tensors)])]
    for name, t in tensors.items():
        _check_tensor(name, t)
        head += [bytes([len(name)]), name.encode(), NAMED_ENTRY.pack(int(t.dtype), len(t.shape)),
                 struct.pack(f"<{len(t.shape)}I", *t.shape)]
    return b"".join(head + [t.data for t in tensors.values()])


def named_directory_bytes(shapes: dict[str, tuple[int, ...]]) -> int:
    """The bytes a NAMED frame's directory takes for tensors of these names and ranks."""
    return 1 + sum(1 + len(name) + NAMED_ENTRY.size + 4 * len(shape) for name, shape in shapes.items())


def named_tensors(frame: Frame) -> dict[str, Tensor]:
    """The tensors of a NAMED frame, each bounded and checked; FrameError on anything malformed."""
    if not frame.flags & Flag.NAMED:
        raise FrameError("not a NAMED frame")
    data, at = frame.payload, 1
    count = data[0] if data else 0
    if not 0 < count <= MAX_TENSORS:
        raise FrameError(f"a NAMED frame carries 1..{MAX_TENSORS} tensors, not {count}")
    entries: list[tuple[str, DType, tuple[int, ...]]] = []
    for _ in range(count):
        if at >= len(data) or not 0 < data[at] <= MAX_NAME or at + 1 + data[at] + NAMED_ENTRY.size > len(data):
            raise FrameError("NAMED frame directory truncated or a name longer than 16 bytes")
        raw_name, at = data[at + 1:at + 1 + data[at]], at + 1 + data[at]
        dtype, ndim = NAMED_ENTRY.unpack_from(data, at)
        at += NAMED_ENTRY.size
        if not 0 < ndim <= MAX_NAMED_NDIM or at + 4 * ndim > len(data):
            raise FrameError(f"NAMED frame directory: ndim {ndim} not 1..{MAX_NAMED_NDIM} or truncated")
        shape, at = struct.unpack_from(f"<{ndim}I", data, at), at + 4 * ndim
        try:
            name, dtype_e = raw_name.decode("ascii"), DType(dtype)
        except (UnicodeDecodeError, ValueError):
            raise FrameError(f"NAMED frame directory: name {raw_name!r} or dtype {dtype} unknown") from None
        if any(name == n for n, _, _ in entries):
            raise FrameError(f"tensor {name} named twice")
        entries.append((name, dtype_e, shape))
    out: dict[str, Tensor] = {}
    for name, dtype_e, shape in entries:
        if dtype_e is DType.NONE or any(d == 0 for d in shape):
            raise FrameError(f"tensor {name}: bad dtype {dtype_e.name} or shape {shape}")
        size = math.prod(shape) * dtype_e.itemsize
        out[name] = Tensor(dtype_e, shape, data[at:at + size])
        _check_tensor(name, out[name])  # also catches a payload shorter than the directory says
        at += size
    if at != len(data):
        raise FrameError(f"NAMED frame: {len(data) - at} bytes after its last tensor")
    return out


# --- handshake -------------------------------------------------------------------------
# server -> client: b"PSHS" ver(u8) wire(u8) server_nonce(32)
# client -> server: b"PSHC" ver(u8) wire(u8) role_len(u8) role client_nonce(32) mac(32)
# server -> client: b"PSOK" mac(32)       (or the connection is closed)
# Each side proves the secret over both nonces, so neither a replay nor a fake stage works.

HANDSHAKE_VERSION = 2  # 2: both sides also name the frame VERSION they speak (a v1 peer reads 0x0402 and refuses)
_VERSIONS = struct.Struct("<BB")
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
    return b"PSHS" + _VERSIONS.pack(HANDSHAKE_VERSION, VERSION) + nonce


def _check_versions(handshake: int, frames: int, who: str) -> None:
    if handshake != HANDSHAKE_VERSION:
        raise HandshakeError(f"{who} handshake version {handshake}, this build {HANDSHAKE_VERSION}")
    if frames != VERSION:
        raise HandshakeError(f"{who} wire version {frames}, this build {VERSION}")


def parse_server_hello(data: bytes) -> bytes:
    """The server nonce from its hello; raises HandshakeError on anything else."""
    if len(data) != 6 + NONCE or data[:4] != b"PSHS":
        raise HandshakeError("peer is not a pipeserve stage")
    _check_versions(*_VERSIONS.unpack(data[4:6]), "peer speaks")
    return data[6:]


def client_proof(secret: bytes, role: str, server_nonce: bytes, client_nonce: bytes) -> bytes:
    """The client's reply proving the secret, naming its role ("coordinator", "stage-0", ...)."""
    role_b = role.encode()
    if not 0 < len(role_b) <= MAX_ROLE:
        raise ValueError("role must be 1..64 bytes")
    mac = _mac(secret, b"client", server_nonce, client_nonce, role_b)
    return b"PSHC" + _VERSIONS.pack(HANDSHAKE_VERSION, VERSION) + bytes([len(role_b)]) + role_b + client_nonce + mac


def verify_client(secret: bytes, server_nonce: bytes, head: bytes, rest: bytes) -> tuple[str, bytes]:
    """Check the client's proof (`head` = first 7 bytes, `rest` = the remainder); returns (role, client nonce)."""
    if len(head) != 7 or head[:4] != b"PSHC":
        raise HandshakeError("no handshake: the peer did not start with PSHC")
    version, frames = _VERSIONS.unpack(head[4:6])
    _check_versions(version, frames, "client speaks")
    role_len = head[6]
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
