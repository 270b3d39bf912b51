"""The link measured on the stage transport's path (agent/linkecho.py): through a real relay
with added delay, and between two real agents."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from orchestrator.agent.linkecho import EchoUnavailable, open_echo, time_path
from orchestrator.agent.perf_schemas import LinkSample
from orchestrator.proc import free_port_block
from tests.support.delay_relay import delay_relay


def test_a_relay_with_added_delay_shows_in_the_path_round_trip_but_not_in_the_kernels():
    ports = free_port_block(3)
    port, nonce = open_echo("127.0.0.1", ports, 1 << 20)
    assert port == ports[1]  # the highest: the plans give stages the lowest free ports
    with delay_relay(("127.0.0.1", port), delay_ms=2.0) as relay:
        rtt, bandwidth, _, kernel, local = time_path(relay, nonce, 6, 1 << 20)
    assert rtt >= 4.0, rtt  # two relay delays per round trip
    assert bandwidth > 0 and local == "127.0.0.1"
    # why the kernel's estimate is not the plan's figure: it ends at the relay
    assert kernel is None or kernel < 2.0, kernel
    sample = LinkSample(node_id="b", url="http://x", rtt_ms=kernel, http_rtt_ms=0.3, path_rtt_ms=rtt)
    assert sample.plan_rtt_ms == rtt


def test_without_a_relay_the_path_round_trip_is_loopbacks():
    port, nonce = open_echo("127.0.0.1", free_port_block(3), 1 << 20)
    rtt, _, _, _, local = time_path(("127.0.0.1", port), nonce, 6, 1 << 20)
    # the direct path: from loopback, and a round trip in milliseconds. No upper bound on how long it
    # took: load lengthens it (the relay's added delay is asserted as a lower bound, which no load breaks)
    assert local == "127.0.0.1" and 0 < rtt < 1000, rtt


def test_the_echo_serves_one_connection_with_its_nonce_only():
    port, nonce = open_echo("127.0.0.1", free_port_block(3), 1 << 20)
    with pytest.raises(OSError):  # a wrong nonce: the echo hangs up, no answer to the frame
        time_path(("127.0.0.1", port), "00" * 32, 2, 1 << 16)
    with pytest.raises(OSError):  # and the port is closed after that one connection
        time_path(("127.0.0.1", port), nonce, 2, 1 << 16)


def test_no_more_echoes_are_open_at_once_than_there_are_slots():
    slots = threading.BoundedSemaphore(1)
    ports = free_port_block(3)
    port, nonce = open_echo("127.0.0.1", ports, 1 << 20, slots)
    with pytest.raises(EchoUnavailable, match="in use"):
        open_echo("127.0.0.1", ports, 1 << 20, slots)
    time_path(("127.0.0.1", port), nonce, 2, 1 << 16)  # its one connection done, the slot is free again
    deadline = time.monotonic() + 5
    while not slots.acquire(blocking=False):
        assert time.monotonic() < deadline, "the slot was not given back"
        time.sleep(0.01)
    slots.release()
    port2, _ = open_echo("127.0.0.1", ports, 1 << 20, slots)
    assert port2 == ports[1]
    with pytest.raises(EchoUnavailable, match="in use"):  # held until it is dialled or times out
        open_echo("127.0.0.1", ports, 1 << 20, slots)


def test_an_address_that_is_not_the_nodes_or_a_full_range_is_refused():
    with pytest.raises(EchoUnavailable, match="not an address of this node"):
        open_echo("192.0.2.7", free_port_block(3), 1 << 20)
    lo, hi = free_port_block(2)
    held = [socket.create_server(("127.0.0.1", p)) for p in (lo, hi)]
    try:
        with pytest.raises(EchoUnavailable, match="no free port"):
            open_echo("127.0.0.1", (lo, hi), 1 << 20)
    finally:
        for s in held:
            s.close()
