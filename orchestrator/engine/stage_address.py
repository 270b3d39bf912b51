"""A stage that moved to another node: telling the running processes its new address.

Who dials whom: the coordinator dials every stage (its links), and each stage dials the next
one (its downstream connection). When the control plane restarts stage k on another node,
two running processes hold the old address: the coordinator and stage k-1. Neither is
restarted (they keep their weights); instead

1. the control plane tells the coordinator, over its HTTP API, "stage k is now at ip:port"
   (`POST ROUTE_PATH`), signed with the cluster secret (`sign` / `verify`): the same secret
   the stage transport proves in its handshake, so only the control plane that launched the
   cluster can redirect it;
2. the coordinator re-points its link to stage k, and when every link is up again it sends
   a ROUTE frame (`route_frame`) down the chain ahead of its RESET; each stage takes the next
   stage's address from it (`next_address`) and drops a downstream connection to an old one.

A ROUTE frame is trusted like a RESET: it arrives only from the stage's authenticated
upstream neighbour. A redirect to an address without the secret fails that peer's handshake.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from orchestrator.engine.config import ConfigError, parse_address
from orchestrator.engine.wire import Frame, FrameError, Kind, json_frame

ROUTE_PATH = "/admin/stage-address"
SIGNATURE_HEADER = "X-Pipeserve-Signature"
MAX_SKEW_S = 120.0  # a signed request is refused past this age (and any not newer than the last taken)
_DOMAIN = b"pipeserve stage-address v1\n"  # a signature here is never valid for anything else


class RouteError(ValueError):
    """A stage-address request or ROUTE frame that must be refused; `status` is the HTTP answer."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def sign(secret: bytes, body: bytes) -> str:
    """The signature header value of a stage-address request body."""
    return hmac.new(secret, _DOMAIN + body, hashlib.sha256).hexdigest()


def sequence_at(at: float) -> int:
    """The sequence of a move signed at wall time `at`: microseconds, growing with every move."""
    return int(at * 1_000_000)


def request_body(stage: int, address: str, at: float, seq: int | None = None) -> bytes:
    """The JSON body of a stage-address request (the control plane's side). `seq` orders the
    moves of one cluster: a coordinator takes only a move newer than the last one it took
    (default: `sequence_at(at)`, the signing time in microseconds)."""
    seq = sequence_at(at) if seq is None else seq
    return json.dumps({"stage": stage, "address": address, "at": at, "seq": seq}, separators=(",", ":")).encode()


def verify(secret: bytes, body: bytes, signature: str | None, now: float, stages: int,
           last_seq: int = -1, started_seq: int = -1) -> tuple[int, tuple[str, int], int]:
    """The (stage index, (host, port), sequence) of a signed request; RouteError when it must
    be refused (pure): a bad signature, too old, not newer than `last_seq` — a replayed move,
    even a fresh one, can never undo a later move — or signed before `started_seq`, the
    coordinator's start: a replacement coordinator has taken no move yet, and without this it
    would take any move captured under two minutes before it started."""
    if not signature or not hmac.compare_digest(sign(secret, body), signature.strip().lower()):
        raise RouteError("bad or missing signature", 403)
    try:
        doc = json.loads(body)
        stage, address, at, seq = int(doc["stage"]), str(doc["address"]), float(doc["at"]), int(doc["seq"])
        host_port = parse_address(address)
    except (ValueError, KeyError, TypeError, ConfigError) as exc:
        raise RouteError(f"bad stage-address request: {exc}") from None
    if abs(now - at) > MAX_SKEW_S:
        raise RouteError(f"stage-address request too old or from the future ({now - at:.0f} s)", 403)
    if seq <= started_seq:
        raise RouteError(f"stage-address request {seq} was signed before this coordinator started "
                         f"({started_seq}): a replay", 409)
    if seq <= last_seq:
        raise RouteError(f"stage-address request {seq} is not newer than the last one taken ({last_seq}): "
                         "a replay", 409)
    if not 0 <= stage < stages:
        raise RouteError(f"no stage {stage} (the pipeline has {stages})")
    return stage, host_port, seq


def format_address(host_port: tuple[str, int]) -> str:
    """'ip:port', IPv6 in brackets (what parse_address reads back)."""
    host, port = host_port
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def route_frame(addresses: list[tuple[str, int]]) -> Frame:
    """A ROUTE frame carrying every stage's address, stage 0 first."""
    return json_frame(Kind.ROUTE, {"stages": [format_address(a) for a in addresses]})


def next_address(frame: Frame, index: int) -> tuple[str, int] | None:
    """From a ROUTE frame, the address of stage index+1 (None for the last stage); FrameError if malformed."""
    doc: Any = frame.json()
    stages = doc.get("stages") if isinstance(doc, dict) else None
    if not isinstance(stages, list) or not all(isinstance(s, str) for s in stages) or index >= len(stages):
        raise FrameError("ROUTE frame without a list of stage addresses covering this stage")
    if index + 1 >= len(stages):
        return None
    try:
        return parse_address(stages[index + 1])
    except ConfigError as exc:
        raise FrameError(f"ROUTE frame: {exc}") from None


__all__ = ["MAX_SKEW_S", "ROUTE_PATH", "SIGNATURE_HEADER", "RouteError", "format_address", "next_address",
           "request_body", "route_frame", "sequence_at", "sign", "verify"]
