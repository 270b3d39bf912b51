"""Registrars: the config-file one on real files, the admin-API one against a recording fake."""

from __future__ import annotations

import base64
import json
import os
import threading
from pathlib import Path
from typing import Iterator
from urllib.parse import unquote

import pytest
import yaml

from orchestrator.registrar import (
    AdminApiRegistrar,
    ApiKeyAuth,
    BasicAuth,
    BearerAuth,
    ConfigFileRegistrar,
    RegistrarError,
    registrar_from_settings,
)
from orchestrator.router.config import load_config
from tests.support.stub_http import StubHandler, StubServer

OPERATOR_FILE = """\
server:
  bind_address: 0.0.0.0:8080
  workers: 4
backends:
- name: hand-made
  url: http://10.0.0.9:8000
  weight: 2
  models: [llama]
  api_key: secret-stays
health_checks:
  enabled: true
  interval: 30s
  timeout: 10s
  unhealthy_threshold: 3
  healthy_threshold: 2
  endpoint: /v1/models
selection_strategy: RoundRobin
"""


def test_register_keeps_other_keys_and_backends_and_is_idempotent(tmp_path: Path):
    path = tmp_path / "router.yaml"
    path.write_text(OPERATOR_FILE)
    before = yaml.safe_load(OPERATOR_FILE)
    reg = ConfigFileRegistrar(path)

    reg.register("cluster-a", "http://127.0.0.1:39600", ["smollm2"])
    reg.register("cluster-a", "http://127.0.0.1:39600", ["smollm2"])  # twice: still one entry, no rewrite
    after = yaml.safe_load(path.read_text())
    assert {k: v for k, v in after.items() if k != "backends"} == {k: v for k, v in before.items() if k != "backends"}
    assert list(after) == list(before)  # key order kept too
    assert after["backends"] == before["backends"] + [
        {"name": "cluster-a", "url": "http://127.0.0.1:39600", "weight": 1, "models": ["smollm2"]}]

    mtime = path.stat().st_mtime_ns
    ino = path.stat().st_ino
    reg.register("cluster-a", "http://127.0.0.1:39600", ["smollm2"])
    assert (path.stat().st_mtime_ns, path.stat().st_ino) == (mtime, ino)  # an identical registration writes nothing

    reg.register("cluster-a", "http://127.0.0.1:39700", ["smollm2", "b"], weight=3)  # replaced in place
    entries = yaml.safe_load(path.read_text())["backends"]
    assert [e["name"] for e in entries] == ["hand-made", "cluster-a"]
    assert entries[1] == {"name": "cluster-a", "url": "http://127.0.0.1:39700", "weight": 3, "models": ["smollm2", "b"]}
    assert [(b.name, b.url, b.models, b.weight) for b in reg.backends()] == [
        ("hand-made", "http://10.0.0.9:8000", ("llama",), 2),
        ("cluster-a", "http://127.0.0.1:39700", ("smollm2", "b"), 3)]
    assert reg.backends()[0].extra == {"api_key": "secret-stays"}

    reg.deregister("cluster-a")
    reg.deregister("cluster-a")  # idempotent
    reg.deregister("never-there")
    assert yaml.safe_load(path.read_text()) == before
    assert load_config(path).backends[0].name == "hand-made"  # still a file the router accepts
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []  # no temp file left behind


def test_register_creates_a_missing_file_and_collapses_duplicates(tmp_path: Path):
    path = tmp_path / "sub" / "router.yaml"
    reg = ConfigFileRegistrar(path)
    reg.register("a", "http://127.0.0.1:1/v1", "m")
    assert yaml.safe_load(path.read_text()) == {"backends": [{"name": "a", "url": "http://127.0.0.1:1", "weight": 1,
                                                              "models": ["m"]}]}
    path.write_text("backends:\n- {name: a, url: 'http://x:1'}\n- {name: b, url: 'http://y:1'}\n"
                    "- {name: a, url: 'http://z:1'}\n")
    reg.register("a", "http://127.0.0.1:2", ["m"])
    assert [(b.name, b.url) for b in reg.backends()] == [("a", "http://127.0.0.1:2"), ("b", "http://y:1")]


def test_bad_input_and_unparseable_files_change_nothing(tmp_path: Path):
    path = tmp_path / "router.yaml"
    path.write_text(OPERATOR_FILE)
    reg = ConfigFileRegistrar(path)
    for args in (("", "http://x:1", ["m"]), ("a", "not-a-url", ["m"]), ("a", "http://x:1", ["m"], 0)):
        with pytest.raises(RegistrarError):
            reg.register(*args)
    assert path.read_text() == OPERATOR_FILE
    broken = "backends: [ {name: a\n"
    path.write_text(broken)
    with pytest.raises(RegistrarError, match="not valid YAML, left untouched"):
        reg.register("b", "http://x:1", ["m"])
    with pytest.raises(RegistrarError, match="left untouched"):
        reg.deregister("a")
    assert path.read_text() == broken


def test_concurrent_registrations_from_threads_and_objects_all_land(tmp_path: Path):
    path = tmp_path / "router.yaml"
    path.write_text(OPERATOR_FILE)
    shared = ConfigFileRegistrar(path)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        reg = shared if i % 2 else ConfigFileRegistrar(path)  # a second object: only the flock serializes it
        try:
            for k in range(4):
                reg.register(f"c{i}-{k}", f"http://127.0.0.1:{1000 + i * 10 + k}", ["m"])
            reg.deregister(f"c{i}-0")
        except BaseException as exc:  # noqa: BLE001 (collected and raised by the test)
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    names = [b.name for b in shared.backends()]
    assert len(names) == len(set(names)) == 1 + 6 * 3
    assert set(names) == {"hand-made"} | {f"c{i}-{k}" for i in range(6) for k in range(1, 4)}


def test_write_is_atomic_replace_with_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The new content appears by os.replace of an fsync'ed sibling temp file (never in place)."""
    path = tmp_path / "router.yaml"
    path.write_text(OPERATOR_FILE)
    mode = 0o640
    os.chmod(path, mode)
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])

    def replace(src: str, dst: object) -> None:
        assert Path(src).parent == tmp_path and Path(dst) == path
        assert yaml.safe_load(Path(src).read_text())["backends"][-1]["name"] == "new"
        assert path.read_text() == OPERATOR_FILE  # the old file is whole until the rename
        events.append("replace")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    ConfigFileRegistrar(path).register("new", "http://127.0.0.1:5", ["m"])
    assert events == ["fsync", "replace", "fsync"]  # file data, rename, directory
    assert path.stat().st_mode & 0o777 == mode


class _FakeAdmin(StubHandler):
    """A stand-in for continuum-router's admin API: records every request, keeps backends."""

    def _answer(self, status: int, body: object = None) -> None:
        self.reply(status, json.dumps(body if body is not None else {}).encode())

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        srv = self.server
        srv.seen.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body))
        if srv.expect and not any(self.headers.get(k) == v for k, v in srv.expect.items()):
            return self._answer(401, {"error": "unauthorized"})
        prefix = "/api/admin/backends"
        if self.command == "GET" and self.path == prefix:
            return self._answer(200, {"backends": list(srv.backends.values())})
        if self.command == "POST" and self.path == prefix:
            if body["name"] in srv.backends:
                return self._answer(409, {"error": "exists"})
            srv.backends[body["name"]] = body
            return self._answer(201, body)
        name = unquote(self.path[len(prefix) + 1:])
        if self.command == "PUT" and name in srv.backends:
            srv.backends[name] = body
            return self._answer(200, body)
        if self.command == "DELETE":
            return self._answer(204 if srv.backends.pop(name, None) else 404)
        return self._answer(404)

    do_GET = do_POST = do_PUT = do_DELETE = _handle


@pytest.fixture
def admin_server() -> Iterator[StubServer]:
    """continuum-router itself is not installable here (it ships inside Backend.AI GO), so the
    admin registrar is tested against this fake at the true external seam: an HTTP server that
    records method, path, headers and body of each request."""
    server = StubServer(_FakeAdmin)
    server.seen, server.backends, server.expect = [], {}, {}
    with server:
        yield server


@pytest.mark.parametrize("auth, header, value", [
    (BearerAuth("tok"), "authorization", "Bearer tok"),
    (BasicAuth("admin", "pw"), "authorization", "Basic " + base64.b64encode(b"admin:pw").decode()),
    (ApiKeyAuth("k1"), "x-api-key", "k1"),
])
def test_admin_registrar_sends_the_right_requests(admin_server, auth, header, value):
    admin_server.expect = {header: value}
    url = admin_server.url
    reg = AdminApiRegistrar(url, auth, list_path="/api/admin/backends", create_path="/api/admin/backends",
                            item_path="/api/admin/backends/{name}")
    reg.register("cluster a", "http://127.0.0.1:39600", ["smollm2"])
    reg.register("cluster a", "http://127.0.0.1:39601", ["smollm2"], weight=2)  # exists → replaced
    assert [(b.name, b.url, b.weight) for b in reg.backends()] == [("cluster a", "http://127.0.0.1:39601", 2)]
    reg.deregister("cluster a")
    reg.deregister("cluster a")  # already gone: 404 is fine
    assert reg.backends() == []
    calls = [(m, p, b) for m, p, _, b in admin_server.seen]
    entry = {"name": "cluster a", "url": "http://127.0.0.1:39600", "weight": 1, "models": ["smollm2"]}
    assert calls == [
        ("POST", "/api/admin/backends", entry),
        ("POST", "/api/admin/backends", {**entry, "url": "http://127.0.0.1:39601", "weight": 2}),
        ("PUT", "/api/admin/backends/cluster%20a", {**entry, "url": "http://127.0.0.1:39601", "weight": 2}),
        ("GET", "/api/admin/backends", None),
        ("DELETE", "/api/admin/backends/cluster%20a", None),
        ("DELETE", "/api/admin/backends/cluster%20a", None),
        ("GET", "/api/admin/backends", None),
    ]
    assert all(h.get(header) == value for _, _, h, _ in admin_server.seen)


def test_admin_registrar_defaults_and_errors(admin_server):
    admin_server.expect = {"authorization": "Bearer right"}
    url = admin_server.url
    reg = registrar_from_settings({"kind": "admin_api", "url": url, "auth": {"type": "bearer", "token": "wrong"}})
    with pytest.raises(RegistrarError, match="401 \\(check the admin credentials\\)"):
        reg.register("a", "http://127.0.0.1:1", ["m"])
    assert admin_server.seen[-1][:2] == ("POST", "/admin/backends")  # continuum-router's default path
    assert "wrong" not in repr(reg.auth)
    dead = AdminApiRegistrar("http://127.0.0.1:1", timeout=2)
    with pytest.raises(RegistrarError, match="POST http://127.0.0.1:1/admin/backends"):
        dead.register("a", "http://127.0.0.1:1", ["m"])
    with pytest.raises(RegistrarError, match="unknown registrar kind"):
        registrar_from_settings({"kind": "carrier-pigeon"})
    assert isinstance(registrar_from_settings({"kind": "config_file", "path": "x.yaml"}), ConfigFileRegistrar)
