"""Who may act: login, CSRF, roles. Every refused request changes nothing."""

from __future__ import annotations

import pytest

from orchestrator.control.rules import events as ev
from orchestrator.control.rules.state import Node, Settings
from tests.webapp.conftest import Web, csrf_of

# Every state-changing request of the dashboard, with a body that would succeed or fail on
# its own merits if it got through (it must not get that far).
ACTIONS = [
    ("/settings/distributed", {"distributed_enabled": "on", "transport_backend": "tcp", "port_start": "40000",
                               "port_end": "40009"}),
    ("/settings/viewer-links", {"label": "intruder"}),
    ("/nodes", {"address": "127.0.0.1:1", "token": "x"}),
    ("/nodes/n0/remove", {}),
    ("/cluster/plan", {"model": "m", "nodes": ["a", "b"]}),
    ("/cluster/prepare", {"model": "m", "nodes": ["a", "b"]}),
    ("/cluster/launch", {"model": "m", "nodes": ["a", "b"]}),
    ("/sessions/s1/stop", {}),
]


@pytest.fixture
def seeded(web: Web) -> Web:
    """A registered node to remove (its agent does not exist: the watcher marks it unreachable)."""
    web.orch.post(ev.NodeRegistered(node=Node(id="n0", name="n0", url="http://127.0.0.1:9", credential="c")))
    # settled: the watcher's first report of it (unreachable) changes the state, and must not do so
    # in the middle of a test that asserts a refused action changed nothing (failed once under load)
    web.orch.wait(lambda st: st.node("n0") is not None and st.node("n0").status == "unreachable", 30)
    return web


def _snapshot(web: Web) -> tuple:
    st = web.orch.state
    return st.settings, [n.id for n in st.nodes], st.plan, st.preparation, st.sessions, len(web.auth.viewers())


def test_login_with_a_bad_token_is_401_and_a_good_one_starts_a_session(web: Web):
    c = web.app.test_client()
    r = c.post("/login", data={"token": "not-the-token"})
    assert r.status_code == 401 and b"That token is not valid." in r.data
    with c.session_transaction() as s:
        assert "sid" not in s
    r = c.post("/login", data={"token": web.admin_token})
    assert r.status_code == 302 and r.headers["Location"].endswith("/models")
    with c.session_transaction() as s:  # the role lives on the server, under the cookie's session id
        assert web.auth.session_role(s["sid"]) == "admin" and len(s["csrf"]) > 20


def test_the_viewer_token_logs_in_as_viewer_and_a_bad_viewer_link_is_refused(web: Web):
    c = web.app.test_client()
    assert c.get("/viewer/not-a-token").status_code == 401
    r = c.get(f"/viewer/{web.viewer_token}")
    assert r.status_code == 302 and r.headers["Location"].endswith("/models")
    with c.session_transaction() as s:
        assert web.auth.session_role(s["sid"]) == "viewer"
    # the admin token is not a viewer link
    assert web.app.test_client().get(f"/viewer/{web.admin_token}").status_code == 401


@pytest.mark.parametrize("path", ["/", "/models?tab=distributed", "/models?tab=local", "/sessions", "/chat",
                                  "/settings"])
def test_pages_redirect_to_login_without_a_session(web: Web, path: str):
    r = web.app.test_client().get(path)
    assert r.status_code == 302 and "/login" in r.headers["Location"]


@pytest.mark.parametrize("path,form", ACTIONS)
def test_every_action_is_refused_without_csrf_for_viewers_and_anonymously(seeded: Web, path: str, form: dict):
    before, version = _snapshot(seeded), seeded.orch.state.version
    anonymous = seeded.app.test_client()
    assert anonymous.post(path, data=form).status_code == 401
    admin = seeded.client("admin")
    assert admin.post(path, data=form).status_code == 403  # no CSRF token
    assert admin.post(path, data=form, headers={"X-CSRF-Token": "forged"}).status_code == 403
    assert admin.post(path, data={**form, "csrf_token": "forged"}).status_code == 403
    viewer = seeded.client("viewer")
    assert viewer.post(path, data=form, headers={"X-CSRF-Token": csrf_of(viewer)}).status_code == 403
    assert _snapshot(seeded) == before and seeded.orch.state.version == version


def test_chat_send_needs_a_session_and_csrf(web: Web):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert web.app.test_client().post("/chat/send", json=body).status_code == 401
    admin = web.client("admin")
    assert admin.post("/chat/send", json=body).status_code == 403
    assert admin.post("/chat/send", json={"messages": []}, headers={"X-CSRF-Token": csrf_of(admin)}).status_code == 400


def test_refusals_answer_json_to_programs_and_a_notice_to_htmx(web: Web):
    r = web.app.test_client().post("/cluster/launch", headers={"Accept": "application/json"})
    assert r.status_code == 401 and r.get_json()["error"]["message"] == "log in first"
    admin = web.client("admin")
    r = admin.post("/cluster/launch", headers={"HX-Request": "true"})
    assert r.status_code == 403 and r.headers["HX-Retarget"] == "#notices" and b"CSRF" in r.data


def test_api_state_needs_a_credential_and_never_shows_node_credentials(seeded: Web):
    assert seeded.app.test_client().get("/api/state").status_code == 401
    assert seeded.app.test_client().get("/api/state", headers={"Authorization": "Bearer nope"}).status_code == 401
    for r in (seeded.client("admin").get("/api/state"),
              seeded.app.test_client().get("/api/state", headers={"Authorization": f"Bearer {seeded.viewer_token}"})):
        assert r.status_code == 200
        body = r.get_data(as_text=True)
        assert r.get_json()["nodes"][0]["id"] == "n0"
        assert "credential" not in body and '"c"' not in body


def test_viewer_link_flow_mints_a_working_link_shown_once(web: Web):
    admin = web.client("admin")
    r = admin.post("/settings/viewer-links", data={"label": "wall screen"}, headers={"X-CSRF-Token": csrf_of(admin)})
    assert r.status_code == 200
    link = r.get_data(as_text=True).split('value="', 1)[1].split('"', 1)[0]
    assert "/viewer/" in link and any(v["label"] == "wall screen" for v in web.auth.viewers())
    token = link.rsplit("/", 1)[1]
    viewer = web.app.test_client()
    assert viewer.get(f"/viewer/{token}").status_code == 302
    page = viewer.get("/settings").get_data(as_text=True)
    assert "Viewing only." in page and token not in page and "Create viewer link" not in page


def test_settings_and_state_are_unchanged_by_a_logged_out_session(web: Web):
    admin = web.client("admin")
    csrf = csrf_of(admin)
    assert admin.post("/logout").status_code == 302
    r = admin.post("/settings/distributed", data={"port_start": "40000", "port_end": "40009"},
                   headers={"X-CSRF-Token": csrf})
    assert r.status_code == 401 and web.orch.state.settings == Settings()
