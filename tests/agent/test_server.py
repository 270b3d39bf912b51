"""The HTTP API of a real agent: pairing, 401 everywhere but the identity probe, path traversal, limits."""

from __future__ import annotations

import http.client
import json
import os
import re

import pytest

from orchestrator.agent.client import AgentClient, AgentError
from orchestrator.agent.server import build_routes
from tests.agent.conftest import copy_model

MODEL = "tm"

# One concrete request per protected route; the test below checks that this covers them all.
PROTECTED = [
    ("POST", "/v1/unpair"), ("GET", "/v1/report"), ("GET", "/v1/models"), ("GET", "/v1/models/tm"),
    ("POST", "/v1/models/tm/check"), ("POST", "/v1/models/tm/tickets"), ("POST", "/v1/models/tm/fetch"),
    ("GET", "/v1/models/tm/files"), ("GET", "/v1/models/tm/files/config.json"), ("GET", "/v1/downloads"),
    ("GET", "/v1/downloads/tm"),
    ("POST", "/v1/downloads/tm/cancel"), ("GET", "/v1/processes"), ("POST", "/v1/processes"),
    ("GET", "/v1/processes/c1/stage-0"), ("POST", "/v1/processes/c1/stage-0/stop"),
    ("GET", "/v1/processes/c1/stage-0/logs"), ("POST", "/v1/leases/c1"),
    ("DELETE", "/v1/models/tm"), ("GET", "/v1/hub/models/org/tiny"),
    ("POST", "/v1/links/tickets"), ("GET", "/v1/links/echo"), ("POST", "/v1/links/echo"),
    ("POST", "/v1/links/echo-port"),
    ("POST", "/v1/links/measure"), ("GET", "/v1/links"), ("GET", "/v1/models/tm/profile"),
    ("POST", "/v1/models/tm/profile"),
]


def raw(agent, method: str, path: str, body: object = None, token: str | None = None,
        headers: dict[str, str] | None = None) -> tuple[int, dict | bytes]:
    """A request with the path sent exactly as written (no client-side normalisation of '..')."""
    conn = http.client.HTTPConnection("127.0.0.1", agent.port, timeout=10)
    data = body if isinstance(body, bytes) else (json.dumps(body).encode() if body is not None else None)
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    if token:
        hdrs["Authorization"] = f"Bearer {token}"
    conn.request(method, path, body=data, headers=hdrs)
    resp = conn.getresponse()
    payload = resp.read()
    conn.close()
    try:
        return resp.status, json.loads(payload)
    except ValueError:
        return resp.status, payload


@pytest.fixture
def agent(spawn_agent, test_model_dir):
    a = spawn_agent("a")
    copy_model(test_model_dir, a.models_dir, MODEL)
    return a


def test_protected_list_covers_every_route():
    routes = [r for r in build_routes(agent=None) if r.access != "public"]  # type: ignore[arg-type]
    for r in routes:
        assert any(m == r.method and r.pattern.fullmatch(p) for m, p in PROTECTED), r.pattern.pattern
    assert {r.pattern.pattern for r in build_routes(agent=None) if r.access == "public"} == {  # type: ignore[arg-type]
        "/v1/identity", "/v1/pair"}


def test_every_endpoint_but_identity_needs_the_credential_and_a_refusal_changes_nothing(agent, tmp_path):
    fetch = {"source": {"kind": "peer", "url": "http://127.0.0.1:9", "ticket": "t" * 20},
             "manifest": {"files": {"x.json": {"size": 1, "sha256": "0" * 64}}}}
    for method, path in PROTECTED:
        body = fetch if path.endswith("/fetch") else {}
        for token in (None, "wrong-credential"):
            status, err = raw(agent, method, path, body, token)
            assert status == 401, (method, path, status, err)
            assert err["error"]["type"] == "authentication_error"
        status, _ = raw(agent, method, path, body, headers={"Authorization": f"Basic {agent.client.credential}"})
        assert status == 401
    status, ident = raw(agent, "GET", "/v1/identity")
    assert status == 200 and set(ident) == {"name", "fingerprint", "version", "api"}
    # Nothing happened: no download, no process, the credential still works.
    assert agent.client.downloads() == [] and agent.client.processes() == []
    assert not (agent.models_dir / ".partial").exists()


def test_pairing_stores_only_digests_with_private_permissions(agent):
    with pytest.raises(AgentError) as err:
        AgentClient(agent.url).pair("not-the-token")
    assert err.value.status == 401
    second = AgentClient(agent.url)
    second.pair(agent.token, "second admin")
    assert second.report().name == "a"
    state = agent.state_dir
    assert state.stat().st_mode & 0o777 == 0o700
    for f in state.glob("*.json"):
        assert f.stat().st_mode & 0o777 == 0o600, f
        text = f.read_text()
        assert agent.token not in text and agent.client.credential not in text and second.credential not in text
    second.unpair()
    with pytest.raises(AgentError) as err:
        second.report()
    assert err.value.status == 401
    assert agent.client.report().name == "a"  # other credentials unaffected


def test_credential_survives_a_restart_and_reset_pairing_revokes_it(agent):
    agent.stop()
    agent.restart()
    assert agent.client.report().fingerprint == agent.client.identity().fingerprint
    fingerprint = agent.client.identity().fingerprint
    agent.stop()
    agent.args.append("--reset-pairing")
    agent.restart()
    new_token = re.search(r"pairing token: (\S+)", agent.output()).group(1)
    assert new_token != agent.token
    with pytest.raises(AgentError) as err:
        agent.client.report()
    assert err.value.status == 401
    agent.client.pair(new_token)
    assert agent.client.report().fingerprint == fingerprint  # the identity is stable


TRAVERSALS = [
    "/v1/models/..%2F..%2Fstate/files/auth.json",
    "/v1/models/%2E%2E/files/state/auth.json",
    "/v1/models/tm/files/..%2F..%2Fstate%2Fauth.json",
    "/v1/models/tm/files/../../state/auth.json",
    "/v1/models/tm/files/%2Fetc%2Fpasswd",
    "/v1/models/tm/files//etc/passwd",
    "/v1/models/tm/files/.%2F..%2Ftm%2Fconfig.json",
    "/v1/models/tm/files/config.json%00.txt",
    "/v1/models/.partial/files/x",
]


def test_path_traversal_in_urls_is_refused(agent):
    (agent.models_dir / ".partial").mkdir()
    (agent.models_dir / ".partial" / "x").write_text("hidden")
    for path in TRAVERSALS:
        status, body = raw(agent, "GET", path, token=agent.client.credential)
        assert status == 400, (path, status, body)
        assert isinstance(body, dict) and "error" in body  # a JSON error, never file bytes


def test_symlinks_cannot_leak_files_outside_the_models_directory(agent):
    model = agent.models_dir / MODEL
    os.symlink("/etc/passwd", model / "leak.txt")
    os.symlink(agent.state_dir / "auth.json", model / "auth.json")
    os.symlink("/etc", agent.models_dir / "evil")
    (model / ".git").mkdir()
    (model / ".git" / "config").write_text("[remote] url = https://user:pass@example")
    for path in ("/v1/models/tm/files/leak.txt", "/v1/models/tm/files/auth.json", "/v1/models/evil",
                 "/v1/models/evil/files/passwd", "/v1/models/tm/files/.git/config"):
        status, body = raw(agent, "GET", path, token=agent.client.credential)
        assert status == 400, (path, status, body)
    info = agent.client.model(MODEL)
    assert "leak.txt" not in info.manifest.files and "auth.json" not in info.manifest.files
    assert any(i.startswith("leak.txt") for i in info.ignored)
    assert [m.id for m in agent.client.models()] == [MODEL]
    status, _ = raw(agent, "GET", "/v1/models/tm/files/config.json", token=agent.client.credential)
    assert status == 200


def test_bad_ids_and_manifest_paths_in_bodies_are_refused(agent):
    cred = agent.client.credential
    peer = {"kind": "peer", "url": "http://127.0.0.1:9", "ticket": "t" * 20}
    good_entry = {"size": 1, "sha256": "0" * 64}
    for path, body in [
        ("/v1/models/..%2Fescape/fetch", {"source": peer, "manifest": {"files": {"a": good_entry}}}),
        ("/v1/models/ok/fetch", {"source": peer, "manifest": {"files": {"../../x": good_entry}}}),
        ("/v1/models/ok/fetch", {"source": peer, "manifest": {"files": {"/etc/passwd": good_entry}}}),
        ("/v1/models/ok/fetch", {"source": {**peer, "model_id": "../tm"}, "manifest": {"files": {"a": good_entry}}}),
        ("/v1/models/ok/fetch", {"source": {"kind": "shell", "cmd": "id"}}),
        ("/v1/models/tm/check", {"manifest": {"files": {"a\\..\\b": good_entry}}}),
    ]:
        status, err = raw(agent, "POST", path, body, cred)
        assert status == 400, (path, body, status, err)
    assert agent.client.downloads() == []
    assert sorted(p.name for p in agent.models_dir.iterdir()) == [MODEL]


def test_a_ticket_reads_one_models_files_and_nothing_else(agent, test_model_dir):
    copy_model(test_model_dir, agent.models_dir, "other")
    ticket = agent.client.ticket(MODEL).ticket
    status, data = raw(agent, "GET", "/v1/models/tm/files/config.json", token=ticket)
    assert status == 200 and data == json.loads((test_model_dir / "config.json").read_text())
    status, _ = raw(agent, "GET", "/v1/models/other/files/config.json", token=ticket)
    assert status == 403
    status, listed = raw(agent, "GET", "/v1/models/tm/files", token=ticket)  # what a following peer reads
    assert status == 200 and listed["complete"] and "config.json" in listed["manifest"]["files"]
    assert raw(agent, "GET", "/v1/models/other/files", token=ticket)[0] == 403
    for method, path in PROTECTED:
        if "/files" not in path:
            assert raw(agent, method, path, {}, ticket)[0] == 403, path


def test_range_requests(agent, test_model_dir):
    data = (test_model_dir / "tokenizer.json").read_bytes()
    cred = agent.client.credential
    status, body = raw(agent, "GET", "/v1/models/tm/files/tokenizer.json", token=cred,
                       headers={"Range": "bytes=100-"})
    assert status == 206 and body == data[100:]
    status, body = raw(agent, "GET", "/v1/models/tm/files/tokenizer.json", token=cred,
                       headers={"Range": "bytes=10-19"})
    assert status == 206 and body == data[10:20]
    status, _ = raw(agent, "GET", "/v1/models/tm/files/tokenizer.json", token=cred,
                    headers={"Range": f"bytes={len(data)}-"})
    assert status == 416
    # 5,000 digits once passed the pattern and int() refused them: 500 with a traceback (issue 20)
    status, err = raw(agent, "GET", "/v1/models/tm/files/tokenizer.json", token=cred,
                      headers={"Range": "bytes=" + "9" * 5000 + "-"})
    assert status == 416 and len(err["error"]["message"]) < 200


def test_limits_and_malformed_requests(agent):
    cred = agent.client.credential
    status, err = raw(agent, "POST", "/v1/models/tm/check", b"x" * (2 << 20), cred)
    assert status == 413 and "over" in err["error"]["message"]
    assert raw(agent, "POST", "/v1/models/tm/check", b"{not json", cred)[0] == 400
    assert raw(agent, "POST", "/v1/models/tm/check", [1, 2], cred)[0] == 400
    status, err = raw(agent, "POST", "/v1/leases/c1", {"lease_s": 5, "surprise": 1}, cred)
    assert status == 400 and "surprise" in err["error"]["message"]
    assert raw(agent, "GET", "/v1/nope", token=cred)[0] == 404
    assert raw(agent, "DELETE", "/v1/report", token=cred)[0] == 405
    assert raw(agent, "GET", "/v1/processes/c1/stage-0/logs?lines=99999", token=cred)[0] == 400
    assert agent.client.report().name == "a"  # still serving


def test_unreachable_agent_is_an_agent_error_with_status_0():
    with pytest.raises(AgentError) as err:
        AgentClient("http://127.0.0.1:9", "x", timeout=2).report()
    assert err.value.status == 0 and err.value.code == "unreachable"


def test_deeply_nested_json_on_the_open_pair_route_is_a_400_without_a_traceback(agent):
    """Issue 9 item 5: `[` x 50,000 used to answer 500 with a traceback in the log."""
    status, err = raw(agent, "POST", "/v1/pair", b"[" * 50_000)
    assert status == 400 and "nested too deeply" in err["error"]["message"], err
    status, err = raw(agent, "POST", "/v1/pair", b'{"token": ' + b"[" * 50_000 + b"]" * 50_000 + b"}")
    assert status == 400, err
    assert "Traceback" not in agent.output(400) and "internal_error" not in agent.output(400)
    assert raw(agent, "GET", "/v1/identity")[0] == 200


def test_a_pairing_flood_never_evicts_the_control_planes_credential(spawn_agent):
    """Issue 20 item 6 and issue 39 item 2, on a real agent: pairings past the cap used to drop
    the oldest unused credential, else the oldest — so 40 pairings, each new credential used
    once, dropped the dashboard's (401). Credentials in use (or just paired) are never dropped:
    a pairing past the cap is refused with 409 and changes nothing."""
    from orchestrator.agent.identity import MAX_CREDENTIALS

    agent = spawn_agent("a")
    agent.client.processes()  # the control plane's credential, in use
    minted, refused = [], []
    for _ in range(MAX_CREDENTIALS + 8):
        status, body = raw(agent, "POST", "/v1/pair", {"token": agent.token, "label": "flood"})
        if status == 200:
            minted.append(body["credential"])
            assert raw(agent, "GET", "/v1/processes", token=body["credential"])[0] == 200  # used once
        else:
            refused.append((status, body))
    assert agent.client.processes() == []  # the dashboard's credential: still 200 (was 401)
    assert len(minted) == MAX_CREDENTIALS - 1  # the dashboard's holds the last slot
    assert refused and all(s == 409 and b["error"]["code"] == "too_many_credentials" for s, b in refused)
    assert "--reset-pairing" in refused[0][1]["error"]["message"]
    assert all(raw(agent, "GET", "/v1/processes", token=c)[0] == 200 for c in minted)  # none dropped
    status, _ = raw(agent, "POST", "/v1/unpair", token=minted[0])  # one revoked: one slot free again
    assert status == 200
    assert raw(agent, "POST", "/v1/pair", {"token": agent.token})[0] == 200
    assert raw(agent, "POST", "/v1/pair", {"token": agent.token})[0] == 409


def test_a_flood_of_unused_pairings_cannot_drop_a_credential_just_paired(spawn_agent):
    """A credential not yet used is spared for a grace period, so a flood between a dashboard's
    pairing and its first call cannot take it; the flood's own pairings past the cap are refused."""
    from orchestrator.agent.identity import MAX_CREDENTIALS

    agent = spawn_agent("a")  # its client paired at start and has not called yet
    statuses = [raw(agent, "POST", "/v1/pair", {"token": agent.token})[0] for _ in range(MAX_CREDENTIALS + 4)]
    assert agent.client.processes() == []  # was 401: the oldest never-used one was dropped
    assert statuses.count(200) == MAX_CREDENTIALS - 1 and statuses.count(409) == 5
