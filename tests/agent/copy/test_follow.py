"""A copy that follows a peer's download (orchestrator/agent/copy/follow.py): the pure rules on the peer's
list, a follow of a peer that already holds the model (real agents), refusals, and a peer whose
list is garbage. Following a hub download in progress: tests/control/test_model_follow.py."""

from __future__ import annotations

import hashlib
import signal
import time
from urllib.parse import unquote

import pytest

from orchestrator.agent.client import AgentError
from orchestrator.agent.copy.follow import new_files
from orchestrator.agent.jobs import DownloadError
from orchestrator.agent.schemas import FileEntry, Manifest, OfferedFiles
from orchestrator.proc import wait_until
from tests.agent.conftest import copy_model
from tests.support.files import sha256sums
from tests.support.stub_http import StubHandler, StubServer

A, B = FileEntry(size=1, sha256="a" * 64), FileEntry(size=2, sha256="b" * 64)


def offered(state: str = "running", **files: FileEntry) -> OfferedFiles:
    return OfferedFiles(model_id="m", state=state, complete=state == "present", manifest=Manifest(files=files),
                        total_bytes=3, files_total=2)


def test_only_new_files_are_taken_and_a_listed_file_never_changes():
    assert new_files(offered(**{"x.json": A}), {}) == {"x.json": A}
    assert new_files(offered(**{"x.json": A, "y.bin": B}), {"x.json": A}) == {"y.bin": B}
    with pytest.raises(DownloadError, match="changed x.json") as err:
        new_files(offered(**{"x.json": B}), {"x.json": A})
    assert err.value.code == "mismatch"
    for state in ("failed", "cancelled"):
        with pytest.raises(DownloadError, match=f"download {state}") as err:
            new_files(offered(state), {})
        assert err.value.code == "source_failed" and err.value.keep_partial


def test_following_a_peer_that_holds_the_model_copies_all_of_it(spawn_agent, transfer_model):
    a, b = spawn_agent("a"), spawn_agent("b")
    copy_model(transfer_model, a.models_dir, "tm")
    listed = a.client.offered("tm")
    assert listed.state == "present" and listed.complete and listed.manifest == a.client.model("tm").manifest
    info = b.client.follow_peer("tm", a.client)
    assert info.state == "running"
    done = b.client.wait_download("tm", 120)
    assert done.state == "done" and done.total_bytes == listed.total_bytes, done
    assert sha256sums(b.models_dir / "tm") == sha256sums(transfer_model)
    with pytest.raises(AgentError, match="no manifest and no mirrors"):  # the peer's list is the manifest
        b.client.fetch("tm2", {"kind": "peer", "url": a.url, "ticket": a.client.ticket("tm").ticket, "follow": True},
                       listed.manifest)
    with pytest.raises(AgentError) as err:  # nothing to follow: no model, no download
        b.client.ticket("absent")
    assert err.value.status == 404


class _GarbageHandler(StubHandler):
    """A 'peer' whose list of verified files is not one."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.reply(200, b'{"model_id": "m", "state": "running", "complete": false, '
                        b'"manifest": {"files": {"../x": {}}}}')


def follow_fake_peer(agent, peer: StubServer, timeout: float = 60):
    """`agent` follows model "m" of a stand-in peer to the end; the download's final info."""
    with peer:
        agent.client.fetch("m", {"kind": "peer", "url": peer.url, "ticket": "t" * 32, "follow": True})
        return agent.client.wait_download("m", timeout)


def test_a_peer_list_that_is_not_one_fails_the_copy_without_quoting_it(spawn_agent):
    b = spawn_agent("b")
    info = follow_fake_peer(b, StubServer(_GarbageHandler), 30)
    assert info.state == "failed" and info.error_code == "peer_error", info
    assert info.error == "the peer's list of verified files is malformed"
    assert not (b.models_dir / "m").exists()


class _Liar(StubServer):
    """A 'peer' serving a damaged copy of a model: it lists each file with the genuine sha256 but
    with block digests of its own (damaged) bytes, as whatever answers at a peer's address could."""

    def __init__(self, genuine: dict[str, bytes], damaged: dict[str, bytes]) -> None:
        self.damaged = damaged
        self.listings = 0  # how many times its list was asked for
        files = {}
        for rel, data in genuine.items():
            blocks = None
            if len(data) > 1 << 20:
                bad = damaged[rel]
                blocks = {"size": 1 << 20, "sha256": [hashlib.sha256(bad[i:i + (1 << 20)]).hexdigest()
                                                       for i in range(0, len(bad), 1 << 20)]}
            files[rel] = FileEntry(size=len(data), sha256=hashlib.sha256(data).hexdigest(), blocks=blocks)
        self.listing = OfferedFiles(model_id="m", state="present", complete=True, manifest=Manifest(files=files),
                                    total_bytes=sum(map(len, genuine.values())), files_total=len(files))
        super().__init__(_LiarHandler)


class _LiarHandler(StubHandler):
    server: _Liar
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path.endswith("/files"):
            self.server.listings += 1
            body = self.server.listing.model_dump_json().encode()
        else:
            body = self.server.damaged[unquote(path.split("/files/", 1)[1])]
        self.reply(200, body)


def test_a_followed_peer_cannot_vouch_for_its_own_bytes_with_block_digests(spawn_agent, transfer_model):
    """Block digests in a followed peer's own list are not trusted: each file is checked whole
    against the listed sha256, so damaged bytes with matching blocks are still a mismatch."""
    genuine = {p.relative_to(transfer_model).as_posix(): p.read_bytes()
               for p in sorted(transfer_model.rglob("*")) if p.is_file()}
    big = max(genuine, key=lambda rel: len(genuine[rel]))
    assert len(genuine[big]) > 2 << 20  # several blocks: the lie is in a block-checked file
    damaged = dict(genuine)
    bad = bytearray(genuine[big])
    bad[len(bad) // 2] ^= 0xFF
    damaged[big] = bytes(bad)
    b = spawn_agent("b")
    info = follow_fake_peer(b, _Liar(genuine, damaged))
    assert info.state == "failed" and info.error_code == "mismatch", info
    assert big in info.error, info
    assert not (b.models_dir / "m").exists()


def test_a_followed_peer_listing_a_huge_file_with_no_total_is_refused_before_a_byte(spawn_agent, transfer_model):
    """Issue 20, item 5: a follow source listing `total_bytes: 0` and a 10 TiB file got no 507
    (300 MiB were written before the probe stopped). The job is admitted for what is listed."""
    genuine = {p.relative_to(transfer_model).as_posix(): p.read_bytes()
               for p in sorted(transfer_model.rglob("*")) if p.is_file()}
    peer = _Liar(genuine, genuine)
    big = max(genuine, key=lambda rel: len(genuine[rel]))
    files = dict(peer.listing.manifest.files)
    files[big] = files[big].model_copy(update={"size": 10 << 40, "blocks": None})
    peer.listing = peer.listing.model_copy(update={"manifest": Manifest(files=files), "total_bytes": 0,
                                                   "complete": False, "state": "running"})
    b = spawn_agent("b")
    info = follow_fake_peer(b, peer, 30)
    assert info.state == "failed" and info.error_code == "insufficient_disk_space", info
    written = sum(p.stat().st_size for p in b.models_dir.rglob("*") if p.is_file())
    assert written < 64 << 20, written


def test_a_followed_download_that_never_completes_fails_at_its_deadline_restarts_included(spawn_agent):
    """Issue 20 item 8: a follow source that never completes was polled with no deadline. Past
    PIPESERVE_FOLLOW_DEADLINE_S from the copy's first start the job fails and its partial files
    go; the start is kept with the resume record, so an agent restarted after the deadline does
    not poll the peer again (before: a fresh, endless follow)."""
    genuine = {"config.json": b"{}" * 100, "model.safetensors": b"w" * 4096}
    peer = _Liar(genuine, genuine)
    files = dict(peer.listing.manifest.files)
    peer.listing = peer.listing.model_copy(update={  # the first file verified, the second never
        "manifest": Manifest(files={"config.json": files["config.json"]}), "state": "running", "complete": False})
    deadline = 3.0
    b = spawn_agent("b", env={"PIPESERVE_FOLLOW_DEADLINE_S": f"{deadline:g}"})
    first = time.time()
    peer.start()
    b.client.fetch("m", {"kind": "peer", "url": peer.url, "ticket": "t" * 32, "follow": True})
    work = b.models_dir / ".partial" / "m"
    try:
        wait_until(lambda: (work / "files" / "config.json").exists(), 30, 0.05, "the listed file copied")
        b.stop(signal.SIGKILL)  # down past the deadline
        wait_until(lambda: time.time() > first + deadline + 0.5, deadline + 5, 0.1, "the deadline to pass")
        b.restart()
        polled = peer.listings
        b.client.fetch("m", {"kind": "peer", "url": peer.url, "ticket": "t" * 32, "follow": True})
        info = b.client.wait_download("m", 30)
        print(f"{info.error}; list asked {polled} times before the restart, {peer.listings - polled} after")
        assert info.state == "failed" and info.error_code == "follow_deadline", info
        assert "PIPESERVE_FOLLOW_DEADLINE_S" in info.error
        assert peer.listings == polled  # the restart did not renew the deadline
        assert not work.exists() and not (b.models_dir / "m").exists()  # the partial files are gone
    finally:
        peer.close()
