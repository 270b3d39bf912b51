"""Telling running engine processes that a stage moved: the signed request and the ROUTE frame (pure)."""

from __future__ import annotations

import pytest

from orchestrator.engine.stage_address import (
    MAX_SKEW_S,
    RouteError,
    next_address,
    request_body,
    route_frame,
    sign,
    verify,
)
from orchestrator.engine.wire import HEADER_SIZE, FrameError, Kind, decode_header, encode, json_frame

SECRET = b"cluster-secret"
NOW = 1_000_000.0


def signed(stage: int = 1, address: str = "10.0.0.3:39605", at: float = NOW, secret: bytes = SECRET):
    body = request_body(stage, address, at)
    return body, sign(secret, body)


def test_a_signed_request_is_accepted() -> None:
    body, signature = signed()
    assert verify(SECRET, body, signature, NOW + 1, stages=2) == (1, ("10.0.0.3", 39605), int(NOW * 1_000_000))


def test_a_move_older_than_the_last_one_taken_is_refused_even_within_the_window() -> None:
    """Issue 20, item 3: two signed moves 0.5 s apart, the first replayed 10 s later, was taken
    (200) and the coordinator dialled the dead address. Freshness is now monotonic."""
    first, second = signed(address="10.0.0.3:1", at=NOW), signed(address="10.0.0.4:2", at=NOW + 0.5)
    *_, last = verify(SECRET, *first, NOW + 1, stages=2)
    *_, last = verify(SECRET, *second, NOW + 1, stages=2, last_seq=last)
    for replay in (first, second):
        with pytest.raises(RouteError) as refused:
            verify(SECRET, *replay, NOW + 10, stages=2, last_seq=last)
        assert refused.value.status == 409 and "replay" in str(refused.value)


@pytest.mark.parametrize("case, status, message", [
    ("no signature", 403, "signature"),
    ("other secret", 403, "signature"),
    ("body changed after signing", 403, "signature"),
    ("too old", 403, "too old"),
    ("no such stage", 400, "no stage 2"),
    ("not an address", 400, "bad stage-address request"),
])
def test_refusals(case: str, status: int, message: str) -> None:
    body, signature = signed()
    if case == "no signature":
        signature = ""
    elif case == "other secret":
        body, signature = signed(secret=b"another")
    elif case == "body changed after signing":
        body = request_body(1, "10.6.6.6:39605", NOW)
    elif case == "too old":
        body, signature = signed(at=NOW - MAX_SKEW_S - 1)
    elif case == "no such stage":
        body, signature = signed(stage=2)
    elif case == "not an address":
        body, signature = signed(address="host.example:80")
    with pytest.raises(RouteError) as refused:
        verify(SECRET, body, signature, NOW, stages=2)
    assert refused.value.status == status and message in str(refused.value)


def test_each_stage_reads_its_next_stage_from_a_route_frame() -> None:
    frame = route_frame([("10.0.0.1", 39600), ("10.0.0.3", 39605), ("::1", 39700)])
    decoded, length = decode_header(encode(frame)[:HEADER_SIZE], 1 << 20)  # it survives the wire like any frame
    assert decoded.kind is Kind.ROUTE and length == len(frame.payload)
    assert next_address(frame, 0) == ("10.0.0.3", 39605)
    assert next_address(frame, 1) == ("::1", 39700)
    assert next_address(frame, 2) is None  # the last stage has no next one


@pytest.mark.parametrize("payload, index", [
    ({"stages": "10.0.0.1:1"}, 0),  # not a list
    ({"stages": [1, 2]}, 0),  # not addresses
    ({"stages": ["10.0.0.1:1"]}, 1),  # does not cover this stage
    ({"stages": ["10.0.0.1:1", "nowhere"]}, 0),  # the next one is no ip:port
    (["10.0.0.1:1"], 0),  # not a document
])
def test_a_malformed_route_frame_is_refused(payload: object, index: int) -> None:
    with pytest.raises(FrameError):
        next_address(json_frame(Kind.ROUTE, payload), index)


def test_a_move_signed_before_the_coordinator_started_is_refused() -> None:
    """Issue 39, item 3: a replacement coordinator has taken no move; its start is the floor."""
    body, signature = signed(at=NOW)
    with pytest.raises(RouteError) as refused:
        verify(SECRET, body, signature, NOW + 5, stages=2, started_seq=int((NOW + 1) * 1_000_000))
    assert refused.value.status == 409 and "before this coordinator started" in str(refused.value)
    assert verify(SECRET, body, signature, NOW + 5, stages=2, started_seq=int((NOW - 1) * 1_000_000))[0] == 1
