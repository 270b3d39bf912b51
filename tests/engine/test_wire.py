"""The wire format and the handshake, as pure functions (no sockets).

Every header field a peer controls is checked before it is trusted: a header is accepted
exactly when an independent oracle below says it is valid, and anything else is a
FrameError (never another exception). The handshake passes only with the right secret,
the right version and untouched bytes.
"""

from __future__ import annotations

import json
import math
import struct

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from orchestrator.engine import wire
from orchestrator.engine.wire import (
    HEADER,
    HEADER_SIZE,
    MAGIC,
    MAX_JSON_BYTES,
    VERSION,
    DType,
    Flag,
    Frame,
    FrameError,
    HandshakeError,
    Kind,
    decode_header,
    encode,
    json_frame,
)

LIMIT = 1 << 20  # max_frame_bytes used by these tests


def header(*, magic=MAGIC, version=VERSION, kind=int(Kind.FORWARD), dtype=int(DType.INT32), flags=0, ndim=1,
           pad=0, rid=1, pos=0, shape=(4, 0, 0), length=16) -> bytes:
    """A raw header with every field settable, valid by default (4 int32 token ids)."""
    return HEADER.pack(magic, version, kind, dtype, flags, ndim, pad, rid, pos, *shape, length)


def roundtrip(frame: Frame, limit: int = LIMIT) -> Frame:
    data = encode(frame)
    head, length = decode_header(data[:HEADER_SIZE], limit)
    assert length == len(data) - HEADER_SIZE
    return Frame(head.kind, head.request_id, head.position, head.dtype, head.shape, head.flags, data[HEADER_SIZE:])


def test_header_is_36_bytes():
    assert HEADER_SIZE == 36
    assert len(encode(Frame(Kind.PING))) == 36


@pytest.mark.parametrize("kind", list(Kind))
def test_roundtrip_every_kind(kind):
    frame = json_frame(kind, {"k": kind.name}, request_id=7, position=3)
    back = roundtrip(frame)
    assert back == frame
    assert back.json() == {"k": kind.name}


@pytest.mark.parametrize("dtype", [d for d in DType if d is not DType.NONE])
@pytest.mark.parametrize("shape", [(), (5,), (1, 3), (1, 2, 8)])
def test_roundtrip_every_dtype_and_rank(dtype, shape):
    n = math.prod(shape) * dtype.itemsize
    payload = bytes(i % 256 for i in range(n))
    frame = Frame(Kind.FORWARD, 2**64 - 1, 2**32 - 1, dtype, shape, Flag.SAMPLE | Flag.MORE, payload)
    assert roundtrip(frame) == frame


def test_empty_control_frames_roundtrip():
    for kind in (Kind.CLOSE, Kind.RESET, Kind.PING):
        frame = Frame(kind, request_id=99)
        assert roundtrip(frame) == frame


def test_itemsizes():
    assert [DType(d).itemsize for d in (1, 2, 3, 4)] == [4, 4, 2, 2]


# --- hypothesis: round trips -------------------------------------------------------------

flags_st = st.sampled_from([Flag.NONE, Flag.SAMPLE, Flag.MORE, Flag.SAMPLE | Flag.MORE])


@st.composite
def frames(draw) -> Frame:
    kind = draw(st.sampled_from(list(Kind)))
    dtype = draw(st.sampled_from(list(DType)))
    rid = draw(st.integers(0, 2**64 - 1))
    pos = draw(st.integers(0, 2**32 - 1))
    flags = draw(flags_st)
    if dtype is DType.NONE:
        return Frame(kind, rid, pos, dtype, (), flags, draw(st.binary(max_size=512)))
    shape = tuple(draw(st.lists(st.integers(1, 9), max_size=3)))
    payload = draw(st.binary(min_size=math.prod(shape) * dtype.itemsize, max_size=math.prod(shape) * dtype.itemsize))
    return Frame(kind, rid, pos, dtype, shape, flags, payload)


@settings(max_examples=400, deadline=None)
@given(frames())
def test_roundtrip_property(frame):
    assert roundtrip(frame) == frame


@settings(max_examples=200, deadline=None)
@given(st.lists(frames(), min_size=1, max_size=5))
def test_concatenated_frames_split_back(frames_list):
    data = b"".join(encode(f) for f in frames_list)
    out, at = [], 0
    while at < len(data):
        head, length = decode_header(data[at:at + HEADER_SIZE], LIMIT)
        at += HEADER_SIZE
        out.append(Frame(head.kind, head.request_id, head.position, head.dtype, head.shape, head.flags,
                         data[at:at + length]))
        at += length
    assert out == frames_list


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(json_values, st.sampled_from(list(Kind)))
def test_json_frames_roundtrip(value, kind):
    assert roundtrip(json_frame(kind, value)).json() == value


# --- header validation -----------------------------------------------------------------

@pytest.mark.parametrize("raw,message", [
    pytest.param(header(magic=b"XX"), r"bad magic b'XX'", id="bad-magic"),
    pytest.param(header(magic=b"ps"), r"bad magic", id="lowercase-magic"),
    pytest.param(header(version=0), r"unsupported wire version 0 \(this build speaks 5\)", id="version-0"),
    pytest.param(header(version=3), r"unsupported wire version 3", id="version-3"),
    pytest.param(header(kind=0), r"unknown frame kind 0", id="kind-0"),
    pytest.param(header(kind=12), r"unknown frame kind 12", id="kind-12"),
    pytest.param(header(kind=255), r"unknown frame kind 255", id="kind-255"),
    pytest.param(header(dtype=6), r"or dtype 6", id="dtype-6"),
    pytest.param(header(dtype=200), r"or dtype 200", id="dtype-200"),
    pytest.param(header(flags=64), r"unknown flags 0x40", id="flag-64"),
    pytest.param(header(flags=0x83), r"unknown flags 0x83", id="flag-high"),
    pytest.param(header(ndim=4, shape=(1, 1, 1), length=4), r"ndim 4 > 3", id="ndim-4"),
    pytest.param(header(ndim=255), r"ndim 255 > 3", id="ndim-255"),
    pytest.param(header(ndim=1, shape=(0, 0, 0), length=0), r"bad shape \(0, 0, 0\) for ndim 1", id="zero-dim"),
    pytest.param(header(ndim=3, shape=(1, 0, 64), length=0), r"bad shape", id="zero-middle-dim"),
    pytest.param(header(ndim=1, shape=(4, 2, 0), length=16), r"bad shape \(4, 2, 0\) for ndim 1",
                 id="junk-beyond-ndim"),
    pytest.param(header(length=12), r"payload 12 bytes does not match shape \(4,\) of INT32", id="short-payload"),
    pytest.param(header(length=20), r"payload 20 bytes does not match", id="long-payload"),
    pytest.param(header(dtype=int(DType.BFLOAT16), ndim=3, shape=(1, 2, 64), length=512),
                 r"payload 512 bytes does not match shape \(1, 2, 64\) of BFLOAT16", id="bf16-as-f32-length"),
    pytest.param(header(ndim=1, shape=(LIMIT, 0, 0), length=4 * LIMIT), r"exceeds the 1048576-byte limit",
                 id="oversize"),
    pytest.param(header(length=2**32 - 1), r"frame of 4294967295 bytes exceeds", id="max-u32-length"),
    pytest.param(header(kind=int(Kind.OPEN), dtype=0, ndim=0, shape=(0, 0, 0), length=MAX_JSON_BYTES + 1),
                 r"a frame without dtype carries at most a small JSON payload", id="json-too-large"),
    pytest.param(header(kind=int(Kind.OPEN), dtype=0, ndim=1, shape=(3, 0, 0), length=3),
                 r"a frame without dtype carries at most a small JSON payload", id="json-with-shape"),
])
def test_decode_header_rejects(raw, message):
    with pytest.raises(FrameError, match=message):
        decode_header(raw, LIMIT)


@pytest.mark.parametrize("n", [0, 1, 35, 37])
def test_decode_header_rejects_wrong_size(n):
    with pytest.raises(FrameError, match=f"short header \\({n} of 36 bytes\\)"):
        decode_header(b"\0" * n, LIMIT)


def test_limit_is_inclusive():
    raw = header(ndim=1, shape=(LIMIT // 4, 0, 0), length=LIMIT)
    assert decode_header(raw, LIMIT)[1] == LIMIT
    with pytest.raises(FrameError, match="exceeds"):
        decode_header(raw, LIMIT - 1)


def test_json_limit_is_inclusive():
    ok = header(kind=int(Kind.OPEN), dtype=0, ndim=0, shape=(0, 0, 0), length=MAX_JSON_BYTES)
    assert decode_header(ok, LIMIT)[1] == MAX_JSON_BYTES


def test_json_frame_refuses_to_build_an_oversized_payload():
    with pytest.raises(FrameError, match=f"exceeds {MAX_JSON_BYTES}"):
        json_frame(Kind.OPEN, {"x": "a" * MAX_JSON_BYTES})


@pytest.mark.parametrize("payload", [b"", b"{", b"\xff\xfe", b"not json", b"[" * 60000, b"{\"a\":" * 20000])
def test_non_json_payload_is_a_frame_error(payload):
    """Including JSON nested deeply enough to exhaust the parser's recursion."""
    with pytest.raises(FrameError, match="OPEN frame payload is not JSON"):
        Frame(Kind.OPEN, payload=payload).json()


def _oracle(magic, version, kind, dtype, flags, ndim, s, length, limit) -> bool:
    """Independent statement of what a valid header is."""
    if magic != MAGIC or version != VERSION or kind not in {int(k) for k in Kind}:
        return False
    if dtype not in {int(d) for d in DType} or flags & ~63 or ndim > 3:  # SAMPLE MORE SOLO NAMED RUN BATCH
        return False
    if any(x == 0 for x in s[:ndim]) or any(x != 0 for x in s[ndim:]) or length > limit:
        return False
    if flags & 8:
        return kind == int(Kind.FORWARD) and dtype == 0 and ndim == 0 and length > 0
    if dtype == 0:
        return ndim == 0 and length <= MAX_JSON_BYTES
    return length == math.prod(s[:ndim]) * DType(dtype).itemsize


small = st.one_of(st.integers(0, 3), st.integers(0, 15), st.integers(0, 255))
dims = st.one_of(st.integers(0, 4), st.integers(0, 2**32 - 1))


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    magic=st.sampled_from([MAGIC, MAGIC, MAGIC, b"PT", b"\0\0"]),
    version=st.sampled_from([VERSION, VERSION, 0, 3, 255]),
    kind=st.integers(0, 12) | st.integers(0, 255),
    dtype=st.integers(0, 6) | st.integers(0, 255),
    flags=small,
    ndim=st.integers(0, 4) | st.integers(0, 255),
    s=st.tuples(dims, dims, dims),
    length=st.one_of(st.integers(0, 64), st.integers(0, 2**32 - 1), st.just(MAX_JSON_BYTES + 1)),
    rid=st.integers(0, 2**64 - 1),
    pos=st.integers(0, 2**32 - 1),
)
def test_decode_header_matches_the_oracle(magic, version, kind, dtype, flags, ndim, s, length, rid, pos):
    # Make "length matches the shape" likely enough to exercise the accepting side.
    if dtype in (1, 2, 3, 4) and 0 < ndim <= 3 and rid % 2:
        s = tuple(x % 8 + 1 if i < ndim else 0 for i, x in enumerate(s))
        length = math.prod(s[:ndim]) * DType(dtype).itemsize
    raw = HEADER.pack(magic, version, kind, dtype, flags, ndim, 0, rid, pos, *s, length)
    valid = _oracle(magic, version, kind, dtype, flags, ndim, s, length, LIMIT)
    try:
        frame, got_length = decode_header(raw, LIMIT)
    except FrameError:
        assert not valid, f"valid header rejected: {raw.hex()}"
        return
    assert valid, f"invalid header accepted: {raw.hex()}"
    assert (frame.kind, frame.dtype, frame.flags, frame.shape) == (kind, dtype, flags, tuple(s[:ndim]))
    assert (frame.request_id, frame.position, got_length) == (rid, pos, length)


@settings(max_examples=1000, deadline=None)
@given(st.binary(min_size=HEADER_SIZE, max_size=HEADER_SIZE), st.integers(0, 2**32))
def test_random_bytes_are_a_frame_error_or_a_valid_header(raw, limit):
    try:
        frame, length = decode_header(raw, limit)
    except FrameError:
        return
    assert length <= limit and raw[:2] == MAGIC


# --- handshake -------------------------------------------------------------------------

SECRET = b"cluster-secret"


def exchange(client_secret: bytes, server_secret: bytes, role: str = "coordinator",
             tamper_client=lambda b: b, tamper_server=lambda b: b) -> str:
    """Run the three handshake messages through the pure functions; returns the role the server saw."""
    server_nonce = wire.new_nonce()
    hello = wire.server_hello(server_nonce)
    got_server_nonce = wire.parse_server_hello(hello)
    client_nonce = wire.new_nonce()
    proof = tamper_client(wire.client_proof(client_secret, role, got_server_nonce, client_nonce))
    head, rest = proof[:7], proof[7:]
    seen_role, seen_nonce = wire.verify_client(server_secret, server_nonce, head, rest)
    accept = tamper_server(wire.server_proof(server_secret, server_nonce, seen_nonce))
    wire.verify_server(client_secret, got_server_nonce, client_nonce, accept)
    return seen_role


def test_right_secret_passes_both_ways():
    assert exchange(SECRET, SECRET) == "coordinator"
    assert exchange(SECRET, SECRET, role="stage-0") == "stage-0"
    assert exchange(SECRET, SECRET, role="ß" * 32) == "ß" * 32  # 64 bytes of UTF-8


def test_wrong_secret_fails_at_the_server():
    with pytest.raises(HandshakeError, match="wrong cluster secret"):
        exchange(b"guess", SECRET)


def test_a_fake_server_cannot_prove_the_secret():
    """The server's proof depends on the secret: a client with the right one rejects a fake."""
    server_nonce, client_nonce = wire.new_nonce(), wire.new_nonce()
    fake = wire.server_proof(b"guess", server_nonce, client_nonce)
    with pytest.raises(HandshakeError, match="stage failed to prove the cluster secret"):
        wire.verify_server(SECRET, server_nonce, client_nonce, fake)


def test_server_proof_is_not_the_client_proof_reflected():
    """Labels differ, so a server cannot echo the client's MAC back as its own proof."""
    server_nonce, client_nonce = wire.new_nonce(), wire.new_nonce()
    mac = wire.client_proof(SECRET, "x", server_nonce, client_nonce)[-32:]
    with pytest.raises(HandshakeError):
        wire.verify_server(SECRET, server_nonce, client_nonce, b"PSOK" + mac)


def test_replayed_proof_fails_against_a_fresh_nonce():
    old_nonce, client_nonce = wire.new_nonce(), wire.new_nonce()
    proof = wire.client_proof(SECRET, "coordinator", old_nonce, client_nonce)
    with pytest.raises(HandshakeError, match="wrong cluster secret"):
        wire.verify_client(SECRET, wire.new_nonce(), proof[:7], proof[7:])


def _flip(at: int):
    def tamper(data: bytes) -> bytes:
        return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:]
    return tamper


@pytest.mark.parametrize("where", ["mac", "nonce", "role"])
def test_tampered_client_proof_fails(where):
    # layout: PSHC(4) ver(2) role_len(1) role "coordinator"(11) nonce(32) mac(32)
    at = {"role": 7 + 3, "nonce": 18 + 5, "mac": 50 + 31}[where]
    with pytest.raises(HandshakeError, match="wrong cluster secret"):
        exchange(SECRET, SECRET, tamper_client=_flip(at))


def test_tampered_server_proof_fails():
    with pytest.raises(HandshakeError, match="stage failed to prove the cluster secret"):
        exchange(SECRET, SECRET, tamper_server=_flip(35))
    with pytest.raises(HandshakeError, match="stage refused the handshake"):
        exchange(SECRET, SECRET, tamper_server=_flip(0))
    with pytest.raises(HandshakeError, match="stage refused the handshake"):
        exchange(SECRET, SECRET, tamper_server=lambda b: b[:-1])


def test_server_hello_version_mismatch():
    hello = b"PSHS" + struct.pack("<BB", wire.HANDSHAKE_VERSION + 1, VERSION) + wire.new_nonce()
    with pytest.raises(HandshakeError, match=r"peer speaks handshake version 3, this build 2"):
        wire.parse_server_hello(hello)


@pytest.mark.parametrize("hello,message", [
    (b"PSHS" + struct.pack("<BB", 2, 4) + b"n" * 32, r"peer speaks wire version 4, this build 5"),
    (b"PSHS" + struct.pack("<H", 1) + b"n" * 32, r"peer speaks handshake version 1, this build 2"),  # a v1 build
])
def test_server_hello_of_another_wire_version_is_refused(hello, message):
    """A peer whose frames are of another version is refused at the handshake, before any frame."""
    with pytest.raises(HandshakeError, match=message):
        wire.parse_server_hello(hello)


@pytest.mark.parametrize("hello", [b"", b"PSHS", b"HTTP/1.1 200 OK\r\n" + b"x" * 21, b"PSHX\x01\x00" + b"n" * 32,
                                   wire.server_hello(b"n" * 32) + b"extra"])
def test_server_hello_not_a_stage(hello):
    with pytest.raises(HandshakeError, match="peer is not a pipeserve stage"):
        wire.parse_server_hello(hello)


def test_client_version_mismatch():
    server_nonce, client_nonce = wire.new_nonce(), wire.new_nonce()
    proof = wire.client_proof(SECRET, "coordinator", server_nonce, client_nonce)
    bumped = proof[:4] + struct.pack("<BB", wire.HANDSHAKE_VERSION + 1, VERSION) + proof[6:]
    with pytest.raises(HandshakeError, match="client speaks handshake version 3, this build 2"):
        wire.verify_client(SECRET, server_nonce, bumped[:7], bumped[7:])
    older = proof[:4] + struct.pack("<BB", wire.HANDSHAKE_VERSION, VERSION - 1) + proof[6:]
    with pytest.raises(HandshakeError, match="client speaks wire version 4, this build 5"):
        wire.verify_client(SECRET, server_nonce, older[:7], older[7:])


@pytest.mark.parametrize("head,rest,message", [
    (b"GET / H", b"", "did not start with PSHC"),
    (b"PSHC\x01\x00", b"", "did not start with PSHC"),  # 6-byte head
    (b"PSHC\x02\x05\x00", b"\0" * 64, "malformed handshake"),  # role length 0
    (b"PSHC\x02\x05\x41", b"\0" * (65 + 64), "malformed handshake"),  # role length 65
    (b"PSHC\x02\x05\x05", b"\0" * 10, "malformed handshake"),  # truncated
    (b"PSHC\x02\x05\x05", b"\0" * 102, "malformed handshake"),  # too long
])
def test_verify_client_rejects_malformed(head, rest, message):
    with pytest.raises(HandshakeError, match=message):
        wire.verify_client(SECRET, wire.new_nonce(), head, rest)


def test_role_that_is_not_utf8_is_refused_even_with_a_valid_mac():
    server_nonce, client_nonce = wire.new_nonce(), wire.new_nonce()
    role = b"\xff\xfe"
    mac = wire._mac(SECRET, b"client", server_nonce, client_nonce, role)
    head = b"PSHC" + struct.pack("<BBB", wire.HANDSHAKE_VERSION, VERSION, len(role))
    with pytest.raises(HandshakeError, match="role is not UTF-8"):
        wire.verify_client(SECRET, server_nonce, head, role + client_nonce + mac)


@pytest.mark.parametrize("role", ["", "x" * 65, "é" * 33])
def test_client_proof_refuses_bad_roles(role):
    with pytest.raises(ValueError, match="role must be 1..64 bytes"):
        wire.client_proof(SECRET, role, wire.new_nonce(), wire.new_nonce())


def test_rest_length():
    assert wire.rest_length(b"PSHC\x02\x05\x0b") == 11 + 64
    assert wire.rest_length(b"PSHC\x02\x05") == 0


def test_nonces_are_fresh():
    assert len({wire.new_nonce() for _ in range(100)}) == 100


secrets_st = st.binary(min_size=1, max_size=64)
roles_st = st.text(min_size=1, max_size=16).filter(lambda r: len(r.encode()) <= wire.MAX_ROLE)


@settings(max_examples=300, deadline=None)
@given(secrets_st, roles_st)
def test_handshake_property_same_secret_passes(secret, role):
    assert exchange(secret, secret, role=role) == role


@settings(max_examples=300, deadline=None)
@given(secrets_st, secrets_st, roles_st)
def test_handshake_property_other_secret_fails(a, b, role):
    assume(a != b)
    with pytest.raises(HandshakeError):
        exchange(a, b, role=role)


@settings(max_examples=500, deadline=None)
@given(st.data(), roles_st)
def test_handshake_property_any_byte_changed_fails(data, role):
    server_nonce, client_nonce = wire.new_nonce(), wire.new_nonce()
    proof = wire.client_proof(SECRET, role, server_nonce, client_nonce)
    at = data.draw(st.integers(0, len(proof) - 1))
    xor = data.draw(st.integers(1, 255))
    bad = proof[:at] + bytes([proof[at] ^ xor]) + proof[at + 1:]
    with pytest.raises(HandshakeError):
        wire.verify_client(SECRET, server_nonce, bad[:7], bad[7:])
    accept = wire.server_proof(SECRET, server_nonce, client_nonce)
    at = data.draw(st.integers(0, len(accept) - 1))
    bad = accept[:at] + bytes([accept[at] ^ xor]) + accept[at + 1:]
    with pytest.raises(HandshakeError):
        wire.verify_server(SECRET, server_nonce, client_nonce, bad)


def test_frame_json_of_a_json_frame():
    assert json.loads(encode(json_frame(Kind.OPEN, {"a": 1}))[HEADER_SIZE:]) == {"a": 1}


# --- NAMED frames: several tensors across a stage boundary ---------------------------------

def _named(tensors: dict, flags: Flag = Flag.NAMED) -> Frame:
    payload = wire.named_payload(tensors)
    return Frame(Kind.FORWARD, 5, 9, DType.NONE, (), flags, payload)


def _t(dtype: DType, shape: tuple[int, ...]) -> wire.Tensor:
    return wire.Tensor(dtype, shape, bytes(i % 251 for i in range(math.prod(shape) * dtype.itemsize)))


def test_named_frame_roundtrip():
    tensors = {"h": _t(DType.BFLOAT16, (1, 3, 8)), "per_layer": _t(DType.FLOAT32, (1, 3, 2, 4)),
               "tokens": _t(DType.INT32, (3,))}
    back = roundtrip(_named(tensors, Flag.NAMED | Flag.SAMPLE))
    assert back.flags == Flag.NAMED | Flag.SAMPLE
    assert wire.named_tensors(back) == tensors
    assert list(wire.named_tensors(back)) == ["h", "per_layer", "tokens"]  # order kept


def test_one_tensor_frames_are_unchanged_in_cost():
    """Only a frame that carries more than one tensor pays for a directory."""
    h = bytes(2 * 3 * 8)
    assert len(encode(Frame(Kind.FORWARD, 1, 0, DType.BFLOAT16, (1, 3, 8), Flag.NONE, h))) == HEADER_SIZE + len(h)


def test_named_directory_cost():
    tensors = {"h": _t(DType.BFLOAT16, (1, 1, 8)), "ple": _t(DType.BFLOAT16, (1, 1, 4, 2))}
    # count, then per tensor name_len + name + dtype + ndim + 4 bytes per dimension
    assert len(wire.named_payload(tensors)) == 1 + (1 + 1 + 2 + 12) + (1 + 3 + 2 + 16) + 16 + 16


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.from_regex(r"[a-z_][a-z0-9_]{0,15}", fullmatch=True),
                       st.tuples(st.sampled_from([d for d in DType if d is not DType.NONE]),
                                 st.lists(st.integers(1, 5), min_size=1, max_size=4)),
                       min_size=1, max_size=wire.MAX_TENSORS))
def test_named_roundtrip_property(spec):
    tensors = {name: _t(dtype, tuple(shape)) for name, (dtype, shape) in spec.items()}
    assert wire.named_tensors(roundtrip(_named(tensors))) == tensors


@pytest.mark.parametrize("tensors,message", [
    pytest.param({}, r"1\.\.8 tensors, not 0", id="none"),
    pytest.param({f"t{i}": _t(DType.INT32, (1,)) for i in range(9)}, r"1\.\.8 tensors, not 9", id="nine"),
    pytest.param({"": _t(DType.INT32, (1,))}, r"tensor name '' is not", id="empty-name"),
    pytest.param({"x" * 17: _t(DType.INT32, (1,))}, r"is not 1\.\.16 ASCII", id="long-name"),
    pytest.param({"a-b": _t(DType.INT32, (1,))}, r"tensor name 'a-b'", id="punctuation"),
    pytest.param({"é": _t(DType.INT32, (1,))}, r"tensor name 'é'", id="non-ascii"),
    pytest.param({"h": wire.Tensor(DType.NONE, (1,), b"x")}, r"tensor h: bad dtype NONE", id="dtype-none"),
    pytest.param({"h": wire.Tensor(DType.INT32, (), b"")}, r"tensor h: bad dtype INT32 or shape \(\)", id="scalar"),
    pytest.param({"h": wire.Tensor(DType.INT32, (1,) * 5, bytes(4))}, r"shape \(1, 1, 1, 1, 1\)", id="ndim-5"),
    pytest.param({"h": wire.Tensor(DType.INT32, (0, 2), b"")}, r"shape \(0, 2\)", id="zero-dim"),
    pytest.param({"h": wire.Tensor(DType.INT32, (2,), bytes(7))}, r"tensor h: 7 bytes do not match shape \(2,\)",
                 id="short-data"),
])
def test_named_payload_refuses_to_build(tensors, message):
    with pytest.raises(FrameError, match=message):
        wire.named_payload(tensors)


GOOD = wire.named_payload({"h": _t(DType.FLOAT16, (1, 2, 4)), "kv": _t(DType.FLOAT32, (1, 1, 2, 2))})


def _entry(name: bytes, dtype: int, dims: tuple[int, ...]) -> bytes:
    return bytes([len(name)]) + name + bytes([dtype, len(dims)]) + struct.pack(f"<{len(dims)}I", *dims)


@pytest.mark.parametrize("payload,message", [
    pytest.param(b"\x00", r"1\.\.8 tensors, not 0", id="count-0"),
    pytest.param(b"\x09" + b"\0" * 40, r"1\.\.8 tensors, not 9", id="count-9"),
    pytest.param(b"\x01", r"directory truncated", id="no-directory"),
    pytest.param(b"\x01\x00" + b"\0" * 20, r"directory truncated or a name longer", id="name-length-0"),
    pytest.param(b"\x01\x11" + b"a" * 17 + b"\x01\x01" + b"\0" * 8, r"a name longer than 16", id="name-length-17"),
    pytest.param(b"\x01" + _entry(b"h", 1, (1,))[:-2], r"ndim 1 not 1\.\.4 or truncated", id="dims-truncated"),
    pytest.param(b"\x01" + _entry(b"h", 1, ()) + b"\0" * 4, r"ndim 0 not 1\.\.4", id="ndim-0"),
    pytest.param(b"\x01" + _entry(b"h", 1, (1,) * 5) + b"\0" * 4, r"ndim 5 not 1\.\.4", id="ndim-5"),
    pytest.param(b"\x01" + _entry(b"h", 9, (1,)) + b"\0" * 4, r"name b'h' or dtype 9 unknown", id="dtype-9"),
    pytest.param(b"\x01" + _entry(b"\xff", 1, (1,)) + b"\0" * 4, r"name b'\\xff' or dtype 1", id="name-not-ascii"),
    pytest.param(b"\x01" + _entry(b"a b", 1, (1,)) + b"\0" * 4, r"tensor name 'a b' is not", id="name-space"),
    pytest.param(b"\x01" + _entry(b"h", 0, (1,)) + b"\0", r"tensor h: bad dtype NONE", id="dtype-none"),
    pytest.param(b"\x01" + _entry(b"h", 1, (0,)), r"tensor h: bad dtype INT32 or shape \(0,\)", id="zero-dim"),
    pytest.param(b"\x02" + _entry(b"h", 1, (1,)) + _entry(b"h", 1, (1,)) + b"\0" * 8, r"tensor h named twice",
                 id="duplicate"),
    pytest.param(b"\x01" + _entry(b"h", 1, (2,)) + b"\0" * 7, r"tensor h: 7 bytes do not match shape \(2,\)",
                 id="short-data"),
    pytest.param(b"\x01" + _entry(b"h", 1, (2**31, 2**31)) + b"\0" * 8, r"bytes do not match shape",
                 id="huge-claim"),
    pytest.param(GOOD + b"\0", r"1 bytes after its last tensor", id="trailing"),
    pytest.param(GOOD[:-1], r"tensor kv: 15 bytes do not match", id="truncated"),
])
def test_named_tensors_refuses(payload, message):
    with pytest.raises(FrameError, match=message):
        wire.named_tensors(Frame(Kind.FORWARD, 1, 0, DType.NONE, (), Flag.NAMED, payload))


def test_named_tensors_of_a_plain_frame_is_refused():
    with pytest.raises(FrameError, match="not a NAMED frame"):
        wire.named_tensors(Frame(Kind.FORWARD, 1, 0, DType.INT32, (1,), Flag.NONE, bytes(4)))


@pytest.mark.parametrize("raw", [
    pytest.param(header(flags=8), id="with-dtype"),
    pytest.param(header(kind=int(Kind.OPEN), dtype=0, ndim=0, shape=(0, 0, 0), flags=8), id="not-forward"),
    pytest.param(header(dtype=0, ndim=0, shape=(0, 0, 0), flags=8, length=0), id="empty"),
    pytest.param(header(dtype=0, ndim=1, shape=(4, 0, 0), flags=8), id="with-shape"),
])
def test_named_header_rules(raw):
    with pytest.raises(FrameError, match="a NAMED frame is a FORWARD frame without dtype or shape"):
        decode_header(raw, LIMIT)


def test_named_frame_is_bounded_by_the_frame_limit_beyond_the_json_limit():
    ok = header(dtype=0, ndim=0, shape=(0, 0, 0), flags=8, length=LIMIT)
    assert decode_header(ok, LIMIT)[1] == LIMIT > MAX_JSON_BYTES
    with pytest.raises(FrameError, match="exceeds the"):
        decode_header(ok, LIMIT - 1)
