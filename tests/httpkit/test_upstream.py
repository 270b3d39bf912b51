"""The client watch over real loopback sockets: a client that leaves shuts the upstream down."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from orchestrator.httpkit.upstream import ClientWatch, connect, peer_closed
from orchestrator.proc import free_port, wait_until


def _pair() -> tuple[socket.socket, socket.socket]:
    """Two ends of one TCP connection on loopback (a relay's side first, its peer second)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        peer = socket.create_connection(listener.getsockname())
        ours, _ = listener.accept()
    return ours, peer


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    """client (the relay's end), browser (the client's end), upstream (the relay's), backend (its peer)."""
    client, browser = _pair()
    upstream, backend = _pair()
    held = [client, browser, upstream, backend]
    yield held
    for s in held:
        s.close()


def _eof(sock: socket.socket) -> bool:
    sock.settimeout(0.2)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False


def test_a_client_that_closes_shuts_the_upstream_down_and_is_said_to_be_gone(sockets):
    client, browser, upstream, backend = sockets
    with ClientWatch(client, upstream) as watch:
        assert not watch.gone and not _eof(backend)  # nothing happened yet: the backend's peer is open
        browser.close()
        wait_until(lambda: watch.gone, 10, message="the watch to notice the client left")
        wait_until(lambda: _eof(backend), 10, message="the backend to see its client go")
    assert watch.gone


def test_a_client_that_stays_or_sends_bytes_is_not_gone_and_the_upstream_stays_open(sockets):
    client, browser, upstream, backend = sockets
    with ClientWatch(client, upstream) as watch:
        browser.sendall(b"GET / HTTP/1.1\r\n")  # a pipelined next request is not a close
        assert not _eof(backend)
        assert not watch.gone
    upstream.sendall(b"x")  # the watch ended without touching the upstream
    assert backend.recv(1) == b"x" and not peer_closed(client)


def test_peer_closed_reads_nothing_it_peeks_at(sockets):
    client, browser, _, _ = sockets
    browser.sendall(b"abc")
    wait_until(lambda: client.recv(3, socket.MSG_PEEK) == b"abc", 5, message="the bytes to arrive")
    assert not peer_closed(client)
    assert client.recv(3) == b"abc"  # still there
    browser.close()
    wait_until(lambda: peer_closed(client), 5, message="the close to arrive")


def test_connect_raises_oserror_when_nothing_listens():
    with pytest.raises(OSError):
        connect(f"http://127.0.0.1:{free_port()}", 2)
