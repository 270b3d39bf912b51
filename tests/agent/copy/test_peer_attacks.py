"""A real agent downloading from a malicious peer (a small HTTP server in the test).

The peer may send more than the manifest says, redirect, answer with bodies meant for the
job's error, or hold a download open while another one asks for the same disk space.
"""

from __future__ import annotations

import hashlib
import shutil
import signal
from collections.abc import Iterator

import pytest
import requests

from orchestrator.agent.client import AgentError
from orchestrator.agent.schemas import FileEntry, Manifest
from orchestrator.proc import wait_until
from tests.support.fake_peer import FakePeer, flood, redirect, serve, short_whole, status, trickle

MODEL = "tm"
CONTENT = b"0123456789"  # the manifest's 10-byte file
FILE_PATH = f"/v1/models/{MODEL}/files/config.json"
TICKET = "t" * 24


def manifest_for(body: bytes = CONTENT, name: str = "config.json") -> Manifest:
    return Manifest(files={name: FileEntry(size=len(body), sha256=hashlib.sha256(body).hexdigest())})


@pytest.fixture
def peer() -> Iterator[FakePeer]:
    fake = FakePeer().start()
    yield fake
    fake.close()


def fetch(agent, url: str, manifest: Manifest | None = None, model_id: str = MODEL):
    return agent.client.fetch(model_id, {"kind": "peer", "url": url, "ticket": TICKET}, manifest or manifest_for())


@pytest.mark.parametrize("declare_length", [False, True], ids=["no-length", "lying-length"])
def test_a_peer_sending_more_than_the_manifest_says_is_cut_off(spawn_agent, peer, declare_length):
    b = spawn_agent("b")
    peer.behaviours[FILE_PATH] = flood(64 << 20, declare_length)
    fetch(b, peer.url)
    failed = b.client.wait_download(MODEL, timeout=60)
    print(f"peer sent {peer.sent / 2**20:.1f} MiB, agent kept {failed.transferred_bytes} bytes, "
          f"requests {len(peer.paths())}")
    assert failed.state == "failed" and failed.error_code == "peer_error", failed
    assert "10 bytes" in failed.error and "config.json" in failed.error
    assert failed.transferred_bytes <= len(CONTENT)  # nothing beyond the manifest's size was kept
    assert peer.paths() == [FILE_PATH]  # no retry of a peer that broke the protocol
    assert peer.sent < 16 << 20  # the agent hung up (what did cross is the kernel's socket buffers)
    assert not (b.models_dir / ".partial" / MODEL).exists()  # nothing resumable: the partial files are gone
    assert not (b.models_dir / MODEL).exists()


def test_partial_files_of_a_mismatched_download_are_deleted(spawn_agent, peer):
    b = spawn_agent("b")
    peer.behaviours[FILE_PATH] = serve(b"abcdefghij")  # right size, wrong content
    fetch(b, peer.url)
    failed = b.client.wait_download(MODEL, timeout=60)
    assert failed.state == "failed" and failed.error_code == "mismatch", failed
    assert not (b.models_dir / ".partial" / MODEL).exists()


def test_in_progress_downloads_count_against_the_free_disk(spawn_agent, peer):
    b = spawn_agent("b")
    free = shutil.disk_usage(b.models_dir).free
    size = int(free * 0.6)  # either download fits alone; both together do not
    big = Manifest(files={"model.safetensors": FileEntry(size=size, sha256="0" * 64)})
    peer.behaviours["/v1/models/first/files/model.safetensors"] = trickle(size)
    peer.behaviours["/v1/models/second/files/model.safetensors"] = trickle(size)
    assert fetch(b, peer.url, big, "first").state == "running"
    with pytest.raises(AgentError) as err:
        fetch(b, peer.url, big, "second")
    assert err.value.status == 507 and err.value.code == "insufficient_disk_space", err.value
    assert "in progress" in err.value.message
    assert not (b.models_dir / ".partial" / "second").exists()  # refused before touching the disk
    b.client.cancel("first", discard=True)
    # With the first one gone, the same request fits.
    assert fetch(b, peer.url, big, "second").state == "running"
    b.client.cancel("second", discard=True)


BAD_URLS = [
    "{root}/?x=1", "{root}?x=1", "{root}/#frag", "{root}#frag", "{root}/v1", "{root}/v1/models/",
    "http://user:pw@127.0.0.1:{port}", "http://user@127.0.0.1:{port}/", "https://127.0.0.1:{port}",
    "http://127.0.0.1", "http://127.0.0.1:", "http://127.0.0.1:99999", "ftp://127.0.0.1:{port}",
    "http://127.0.0.1:{port} ", "http://127.0.0.1:{port}\r\nX: y", "http://127.0.0.1:{port}//",
]


def test_the_peer_url_is_only_http_host_port(spawn_agent, peer):
    b = spawn_agent("b")
    port = peer.url.rsplit(":", 1)[1]
    for template in BAD_URLS:
        url = template.format(root=peer.url, port=port)
        r = requests.post(f"{b.url}/v1/models/{MODEL}/fetch", timeout=10,
                          headers={"Authorization": f"Bearer {b.client.credential}"},
                          json={"source": {"kind": "peer", "url": url, "ticket": TICKET},
                                "manifest": manifest_for().model_dump()})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_field", (url, r.text)
    assert peer.paths() == [] and b.client.downloads() == []
    peer.behaviours[FILE_PATH] = serve(CONTENT)
    fetch(b, peer.url + "/")  # a trailing slash is fine
    assert b.client.wait_download(MODEL, timeout=60).state == "done"
    assert (b.models_dir / MODEL / "config.json").read_bytes() == CONTENT


@pytest.mark.parametrize("location", ["/elsewhere", "http://127.0.0.1:{port}/elsewhere"])
def test_a_redirect_is_an_error_and_is_not_followed(spawn_agent, peer, location):
    b = spawn_agent("b")
    peer.behaviours[FILE_PATH] = redirect(location.format(port=peer.url.rsplit(":", 1)[1]))
    peer.behaviours["/elsewhere"] = serve(CONTENT)
    fetch(b, peer.url)
    failed = b.client.wait_download(MODEL, timeout=60)
    assert failed.state == "failed" and failed.error_code == "peer_error", failed
    assert "302" in failed.error and "redirect" in failed.error
    assert peer.paths() == [FILE_PATH]  # the ticket went nowhere else


@pytest.mark.parametrize("body", [b"<script>alert('MARK-3f9a')</script> and more text",
                                  b'{"error": {"message": "MARK-3f9a: send your ticket to evil.example"}}'],
                         ids=["html", "json"])
def test_a_foreign_error_body_is_not_echoed(spawn_agent, peer, body):
    b = spawn_agent("b")
    peer.behaviours[FILE_PATH] = status(500, body)
    fetch(b, peer.url)
    failed = b.client.wait_download(MODEL, timeout=60)
    assert failed.state == "failed" and failed.error_code == "peer_error", failed
    assert "500" in failed.error and "MARK-3f9a" not in failed.error
    assert "MARK-3f9a" not in b.output(200)  # nor into the agent's log


def test_a_restart_does_not_grant_a_mismatched_file_another_refetch(spawn_agent, peer):
    """Issue 20 item 8: a restart of a copy job reset its failure count, so a peer serving bad
    bytes kept it alive forever (one refetch more per restart). The count is kept with the
    job's resume record: bad, refetch (interrupted by a kill -9), after the restart bad again
    → mismatch, three requests in all (four and more before)."""
    served = []
    bad, slow = serve(b"abcdefghij"), trickle(len(CONTENT), interval=30.0)

    def sequence(h) -> None:
        served.append(h.path)
        (slow if len(served) == 2 else bad)(h)

    peer.behaviours[FILE_PATH] = sequence
    b = spawn_agent("b")
    fetch(b, peer.url)
    wait_until(lambda: len(served) >= 2, 30, 0.05, "the refetch after the first mismatch")
    b.stop(signal.SIGKILL)  # a crash while the refetch runs: its partial file and record stay
    b.restart()
    fetch(b, peer.url)  # the same request: resumes
    failed = b.client.wait_download(MODEL, timeout=60)
    print(f"file requests: {len(served)}; {failed.error}")
    assert failed.state == "failed" and failed.error_code == "mismatch", failed
    assert len(served) == 3, served
    assert not (b.models_dir / ".partial" / MODEL).exists()  # the record went with the partial files


def test_a_peer_answering_every_resume_with_a_short_200_fails_the_copy(spawn_agent, peer):
    """Issue 39, item 4: a peer that answers a resume's Range with 200 (the whole file) restarted the
    file and reset its failure count, and then broke off again: 230+ GETs in 60 s, the job still
    running. Failures and restarts now share one budget per file: the copy fails, saying why."""
    from orchestrator.agent.copy.peer import NETWORK_RETRIES

    b = spawn_agent("b")
    peer.behaviours[FILE_PATH] = short_whole(CONTENT, keep=4)
    fetch(b, peer.url)
    failed = b.client.wait_download(MODEL, timeout=120)
    assert failed.state == "failed" and failed.error_code == "peer_error", failed
    assert "config.json" in failed.error and "whole file" in failed.error, failed.error
    assert len(peer.paths()) <= 2 * (NETWORK_RETRIES + 1), peer.paths()  # each try: a fetch and a resume
    assert not (b.models_dir / MODEL).exists()
