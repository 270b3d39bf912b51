"""Issue 9 items 8, 9, 10, 16 and 17, against a real dashboard process: open redirects, websocket
origins, the router admin token off the command line, chat input, and security headers."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import pytest
import requests

from tests.support.dashboard_server import ROOT, Dashboard, cli, close_code, read_frames, ws_connect
from webapp.guard import safe_next
from webapp.main import ROUTER_TOKEN_ENV, router_admin_token

OFF_SITE = ["//evil.example", "///evil.example", "https://evil.example/x", "http:evil.example", "/\\evil.example",
            "\\\\evil.example", "/\t/evil.example", "/%0a/evil.example".replace("%0a", "\n"), "javascript:alert(1)",
            " //evil.example", "evil.example"]


@pytest.mark.parametrize("target", OFF_SITE)
def test_login_never_redirects_off_site(dashboard: Dashboard, target: str):
    r = requests.post(dashboard.url + "/login", params={"next": target}, data={"token": dashboard.admin_token},
                      allow_redirects=False, timeout=10)
    assert r.status_code == 302
    where = r.headers["Location"]
    assert urlsplit(urljoin(dashboard.url + "/login", where)).netloc == f"127.0.0.1:{dashboard.port}", where
    assert where == "/models", where


def test_login_keeps_a_same_site_next(dashboard: Dashboard):
    r = requests.post(dashboard.url + "/login", params={"next": "/sessions?x=1"},
                      data={"token": dashboard.admin_token}, allow_redirects=False, timeout=10)
    assert r.headers["Location"] == "/sessions?x=1"
    assert safe_next("/models?tab=local", "/d") == "/models?tab=local" and safe_next(None, "/d") == "/d"


@pytest.mark.parametrize("path", ["/ws?components=nodes", "/ws/events"])
def test_websockets_from_another_origin_are_refused(dashboard: Dashboard, path: str):
    cookie = dashboard.login().cookies["session"]
    for origin in ("http://evil.example", f"http://127.0.0.1:{dashboard.port}.evil.example", "null",
                   "http://127.0.0.1", f"http://127.0.0.1:{dashboard.port + 1}", f"ftp://127.0.0.1:{dashboard.port}",
                   f"http://evil.example@127.0.0.1:{dashboard.port}"):
        sock, status, _ = ws_connect(dashboard.port, path, cookie, origin=origin)
        sock.close()
        assert status == 403, origin
    for origin in (f"http://127.0.0.1:{dashboard.port}", None):  # the dashboard's own pages; programs
        sock, status, rest = ws_connect(dashboard.port, path, cookie, origin=origin)
        try:
            frames, closed = read_frames(sock, rest, 1)
            assert status == 101 and not closed and frames, (origin, close_code(frames))
        finally:
            sock.close()


def test_the_router_admin_token_is_refused_on_the_command_line(tmp_path: Path):
    done = cli("dashboard", "--state-dir", str(tmp_path / "s"), "--router-admin-url", "http://127.0.0.1:9",
               "--router-admin-token", "s3cret-on-argv", "--no-discovery", timeout=60)
    assert done.returncode == 2
    assert "--router-admin-token-file" in done.stderr and ROUTER_TOKEN_ENV in done.stderr
    assert not (tmp_path / "s" / "auth.json").exists()  # refused before anything started
    missing = cli("dashboard", "--state-dir", str(tmp_path / "s"), "--router-admin-url", "http://127.0.0.1:9",
                  "--router-admin-token-file", str(tmp_path / "nope"), timeout=60)
    assert missing.returncode == 2 and "nope" in missing.stderr


def test_the_router_admin_token_comes_from_a_file_or_the_environment(tmp_path: Path, monkeypatch):
    f = tmp_path / "router-token"
    f.write_text("from-file\n")
    monkeypatch.setenv(ROUTER_TOKEN_ENV, "from-env")
    assert router_admin_token(argparse.Namespace(router_admin_token_file=f)) == "from-file"
    assert router_admin_token(argparse.Namespace(router_admin_token_file=None)) == "from-env"
    monkeypatch.delenv(ROUTER_TOKEN_ENV)
    assert router_admin_token(argparse.Namespace(router_admin_token_file=None)) is None
    f.write_text("  \n")
    with pytest.raises(ValueError, match="empty"):
        router_admin_token(argparse.Namespace(router_admin_token_file=f))


@pytest.mark.parametrize("field,value,words", [
    ("max_tokens", "abc", "max_tokens must be a whole number"), ("max_tokens", 1.5, "whole number"),
    ("max_tokens", 0, "between 1"), ("max_tokens", [1], "max_tokens"), ("max_tokens", True, "max_tokens"),
    ("temperature", "nan", "temperature must be a number"), ("temperature", "inf", "temperature"),
    ("temperature", 1e400, "temperature"), ("temperature", -1, "between 0"), ("temperature", {}, "temperature"),
])
def test_chat_send_refuses_bad_numbers_with_a_400_the_page_shows(dashboard: Dashboard, field: str, value, words: str):
    admin = dashboard.login()
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], field: value}
    # json.dumps writes 1e400 as Infinity, which Flask's parser accepts as a float
    r = admin.post(dashboard.url + "/chat/send", data=json.dumps(body), timeout=10,
                   headers={"X-CSRF-Token": dashboard.csrf(admin), "Content-Type": "application/json"})
    assert r.status_code == 400, r.text[:300]
    assert words in r.json()["error"]["message"]  # what chat.js shows in the reply bubble


def test_chat_send_with_good_numbers_reaches_the_router(dashboard: Dashboard):
    admin = dashboard.login()
    r = admin.post(dashboard.url + "/chat/send", headers={"X-CSRF-Token": dashboard.csrf(admin)}, timeout=30,
                   json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": "64",
                         "temperature": 0.7})
    assert r.status_code == 502 and "router" in r.json()["error"]["message"]  # no router on port 9


@pytest.mark.parametrize("path", ["/login", "/models?tab=distributed", "/settings", "/static/app.js", "/nope",
                                  "/api/state"])
def test_every_response_carries_the_security_headers(dashboard: Dashboard, path: str):
    r = dashboard.login().get(dashboard.url + path, timeout=10)
    assert r.headers["X-Frame-Options"] == "DENY"
    assert r.headers["X-Content-Type-Options"] == "nosniff"
    assert r.headers["Referrer-Policy"] == "no-referrer"
    csp = {d.split()[0]: d.split()[1:] for d in r.headers["Content-Security-Policy"].split("; ")}
    assert csp["frame-ancestors"] == ["'none'"] and csp["script-src"] == ["'self'"]
    assert csp["default-src"] == ["'none'"] and csp["object-src"] == ["'none'"]


def test_templates_have_no_inline_script_the_csp_would_block():
    for path in (ROOT / "templates").rglob("*.html"):
        html = path.read_text()
        assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html), path  # only <script src=...>
        assert not re.search(r"\son[a-z]+\s*=", html), path  # no onclick= and the like
        assert "javascript:" not in html and "hx-on" not in html, path


def test_a_flood_of_viewer_link_visits_never_logs_the_admin_out(dashboard: Dashboard):
    """Issue 20, item 4, on the real dashboard: cookieless visits of one viewer link each open
    a session; they once filled the global cap and dropped the oldest — the admin's. Now they
    only replace that link's own oldest sessions."""
    from webapp.authstore import MAX_VIEWER_SESSIONS

    admin = dashboard.login()
    r = admin.post(dashboard.url + "/settings/viewer-links", data={"label": "flood"}, timeout=10,
                   headers={"X-CSRF-Token": dashboard.csrf(admin), "HX-Request": "true"})
    assert r.status_code == 200, r.text[:300]
    link = re.search(r"(/viewer/[A-Za-z0-9_-]+)", r.text).group(1)
    first = requests.Session()
    assert first.get(dashboard.url + link, allow_redirects=False, timeout=10).status_code == 302
    assert first.get(dashboard.url + "/api/state", timeout=10).status_code == 200
    with requests.Session() as visits:  # keep-alive, but no cookie kept: each visit is a new session
        for _ in range(MAX_VIEWER_SESSIONS + 8):
            visits.cookies.clear()
            assert visits.get(dashboard.url + link, allow_redirects=False, timeout=10).status_code == 302
    assert admin.get(dashboard.url + "/settings", allow_redirects=False, timeout=10).status_code == 200
    assert first.get(dashboard.url + "/api/state", timeout=10).status_code == 401  # that link's oldest went


def test_chat_send_with_json_nested_50000_deep_is_a_400(dashboard: Dashboard):
    """Issue 20, item 8: `[` x 50,000 gave 500 with a RecursionError."""
    admin = dashboard.login()
    r = admin.post(dashboard.url + "/chat/send", data="[" * 50_000, timeout=10,
                   headers={"X-CSRF-Token": dashboard.csrf(admin), "Content-Type": "application/json"})
    assert r.status_code == 400, r.text[:300]
