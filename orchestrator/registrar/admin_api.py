"""Register backends through continuum-router's admin REST API.

Defaults follow continuum-router's `/admin/backends` resource; every path is configurable
because deployments put the admin API behind prefixes or proxies:

| call          | request                                                   |
|---------------|-----------------------------------------------------------|
| register      | `POST {create_path}` with `{name, url, weight, models}`; on 409 (exists) `PUT {item_path}` |
| deregister    | `DELETE {item_path}`; 404 counts as done                  |
| backends      | `GET {list_path}`: a list, or `{"backends": [...]}` / `{"data": [...]}` |

`{name}` in `item_path` is the URL-quoted backend name. Auth is a bearer token, HTTP basic,
or an API key header (continuum-router: `X-API-Key`).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from urllib.parse import quote

import requests

from orchestrator.registrar.base import BackendEntry, Registrar, RegistrarError, entry_from_dict, validated_entry


@dataclass(frozen=True)
class BearerAuth:
    """`Authorization: Bearer <token>`."""

    token: str

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def __repr__(self) -> str:  # never print a credential
        return "BearerAuth(token=***)"


@dataclass(frozen=True)
class BasicAuth:
    """HTTP basic authentication."""

    username: str
    password: str

    def headers(self) -> dict[str, str]:
        raw = f"{self.username}:{self.password}".encode()
        return {"Authorization": "Basic " + base64.b64encode(raw).decode()}

    def __repr__(self) -> str:
        return f"BasicAuth(username={self.username!r}, password=***)"


@dataclass(frozen=True)
class ApiKeyAuth:
    """An API key in a header (`X-API-Key` by default)."""

    key: str
    header: str = "X-API-Key"

    def headers(self) -> dict[str, str]:
        return {self.header: self.key}

    def __repr__(self) -> str:
        return f"ApiKeyAuth(header={self.header!r}, key=***)"


Auth = BearerAuth | BasicAuth | ApiKeyAuth


class AdminApiRegistrar(Registrar):
    """Talks to a router's admin API; each call is one or two HTTP requests."""

    def __init__(self, base_url: str, auth: Auth | None = None, *, list_path: str = "/admin/backends",
                 create_path: str = "/admin/backends", item_path: str = "/admin/backends/{name}",
                 timeout: float = 10.0, session: requests.Session | None = None,
                 router_url: str | None = None) -> None:
        """`router_url`: the router's own (client) URL, asked whether it routes to an entry; its
        admin API may sit elsewhere (another port, a prefix), so it is never guessed from `base_url`."""
        self.base_url = base_url.rstrip("/")
        self.router_url = router_url
        self.auth = auth
        self.list_path, self.create_path, self.item_path = list_path, create_path, item_path
        self.timeout = timeout
        self._session = session or requests.Session()

    def register(self, name: str, url: str, models: list[str] | tuple[str, ...], weight: int = 1) -> None:
        """POST the backend; if the router says it exists (409), PUT it in place instead."""
        body = validated_entry(name, url, models, weight).as_dict()
        r = self._call("POST", self.create_path, body)
        if r.status_code == 409:
            r = self._call("PUT", self._item(name), body)
        self._check(r, f"register {name!r}")

    def deregister(self, name: str) -> None:
        """DELETE the backend; a 404 means it is already gone."""
        r = self._call("DELETE", self._item(name))
        if r.status_code != 404:
            self._check(r, f"deregister {name!r}")

    def backends(self) -> list[BackendEntry]:
        """GET the backend list."""
        r = self._call("GET", self.list_path)
        self._check(r, "list backends")
        try:
            doc = r.json()
        except ValueError:
            raise RegistrarError(f"{self.base_url}{self.list_path}: the answer is not JSON") from None
        items = doc if isinstance(doc, list) else (doc.get("backends") or doc.get("data") or []) \
            if isinstance(doc, dict) else []
        return [e for e in (entry_from_dict(b) for b in items) if e is not None]

    def _item(self, name: str) -> str:
        return self.item_path.replace("{name}", quote(name, safe=""))

    def _call(self, method: str, path: str, body: dict | None = None) -> requests.Response:
        headers = {"Accept": "application/json", **(self.auth.headers() if self.auth else {})}
        try:
            return self._session.request(method, self.base_url + path, json=body, headers=headers,
                                         timeout=self.timeout)
        except requests.RequestException as exc:
            raise RegistrarError(f"{method} {self.base_url}{path}: {type(exc).__name__}: {exc}") from None

    def _check(self, r: requests.Response, what: str) -> None:
        if 200 <= r.status_code < 300:
            return
        detail = r.text[:300].strip()
        hint = " (check the admin credentials)" if r.status_code in (401, 403) else ""
        raise RegistrarError(f"{what}: {r.request.method} {r.url} answered {r.status_code}{hint}: {detail}")
