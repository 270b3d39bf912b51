"""The auth store shared by the running dashboard and the CLI (two instances on one state dir
stand for the two processes), and the Revoke action through the Flask app."""

from __future__ import annotations

from pathlib import Path

from tests.webapp.conftest import Web, csrf_of
from webapp.authstore import MAX_ADMIN_SESSIONS, MAX_VIEWER_SESSIONS, AuthStore


def test_a_reset_by_another_process_is_seen_at_once_and_never_undone(tmp_path: Path):
    dashboard, cli = AuthStore(tmp_path), AuthStore(tmp_path)
    old = dashboard.ensure_admin_token()
    sid = dashboard.open_session("admin")
    new = cli.reset_admin_token()
    assert dashboard.role_for(old) is None and dashboard.role_for(new) == "admin"
    assert dashboard.session_role(sid) is None
    dashboard.mint_viewer("wall")  # the dashboard's next write keeps the new hash
    dashboard.open_session("admin")
    assert cli.role_for(new) == "admin" and cli.role_for(old) is None
    assert AuthStore(tmp_path).role_for(new) == "admin"


def test_sessions_end_on_close_on_revoke_and_on_expiry(tmp_path: Path):
    now = [1000.0]
    store = AuthStore(tmp_path, clock=lambda: now[0])
    vid, token = store.mint_viewer("screen")
    assert store.identify(token) == ("viewer", vid)
    a, v = store.open_session("admin"), store.open_session("viewer", vid)
    assert store.session_role(a) == "admin" and store.session_role(v) == "viewer"
    store.close_session(a)
    assert store.session_role(a) is None and store.session_role(v) == "viewer"
    assert store.revoke_viewer(vid) and store.session_role(v) is None and store.identify(token) is None
    s = store.open_session("admin")
    now[0] += 8 * 24 * 3600
    assert store.session_role(s) is None and store.session_role("") is None


def test_logins_cannot_grow_the_file_without_bound(tmp_path: Path):
    store = AuthStore(tmp_path)
    first = store.open_session("admin")
    for _ in range(MAX_ADMIN_SESSIONS + 5):
        store.open_session("admin")
    assert store.session_role(first) is None
    assert len(AuthStore(tmp_path)._data["sessions"]) == MAX_ADMIN_SESSIONS
    assert oct(store.path.stat().st_mode & 0o777) == "0o600"


def test_a_viewer_links_visits_never_end_the_admins_or_another_links_sessions(tmp_path: Path):
    """Issue 20, item 4: 1,000 cookieless visits of one viewer link filled the global cap and
    dropped the oldest session, the admin's. Caps are per owner now."""
    store = AuthStore(tmp_path)
    admin = store.open_session("admin")
    other = store.open_session("viewer", "v2")
    first = store.open_session("viewer", "v1")
    for _ in range(MAX_VIEWER_SESSIONS + 20):
        store.open_session("viewer", "v1")
    assert store.session_role(admin) == "admin" and store.session_role(other) == "viewer"
    assert store.session_role(first) is None  # only that link's own oldest made room
    owners = [s.get("viewer") for s in AuthStore(tmp_path)._data["sessions"].values()]
    assert owners.count("v1") == MAX_VIEWER_SESSIONS


def test_revoke_needs_an_admin_and_csrf_and_ends_the_viewers_session(web: Web):
    vid = web.auth.viewers()[0]["id"]
    path = f"/settings/viewer-links/{vid}/revoke"
    viewer, admin = web.client("viewer"), web.client("admin")
    assert web.app.test_client().post(path).status_code == 401
    assert admin.post(path).status_code == 403
    assert viewer.post(path, headers={"X-CSRF-Token": csrf_of(viewer)}).status_code == 403
    assert web.auth.viewers() and viewer.get("/settings").status_code == 200
    page = admin.get("/settings").get_data(as_text=True)
    assert f'action="{path}"' in page and "Revoke" in page
    r = admin.post(path, headers={"X-CSRF-Token": csrf_of(admin), "HX-Request": "true"})
    assert r.status_code == 200 and "No viewer links." in r.get_data(as_text=True)
    assert web.auth.viewers() == []
    r = viewer.get("/settings")
    assert r.status_code == 302 and "/login" in r.headers["Location"]
    assert admin.post(path, headers={"X-CSRF-Token": csrf_of(admin)}).status_code == 404
