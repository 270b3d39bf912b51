"""A Hugging Face Hub stand-in for tests: a local HTTP server speaking the part of the Hub API
that huggingface_hub (2.x) uses to list and download a model repository.

No hub is reachable from the test machines, so agents (and the dashboard's e2e stack) are
pointed at this server with `HF_ENDPOINT`, and the REAL huggingface_hub client does the
work. Routes, as huggingface_hub calls them:

- `GET /api/models/{org}/{name}[/revision/{rev}]?blobs=True`: model_info with files
  metadata: `sha` (the commit), `siblings` [{rfilename, size, blobId, lfs: {sha256, size}}],
  `gated`. Unknown repo: 404 `X-Error-Code: RepoNotFound`; unknown revision: 404
  `RevisionNotFound`.
- `HEAD|GET /{org}/{name}/resolve/{rev}/{path}`: the file, with `X-Repo-Commit`, `ETag`
  (the LFS sha256, or the git blob sha1 for small files), `Content-Length`,
  `Accept-Ranges`; `Range: bytes=N-` answers 206 with `Content-Range` (how huggingface_hub
  resumes an `.incomplete` file). A gated repo answers 401 `X-Error-Code: GatedRepo` to a
  request without the repo's token.

Faults a test can arm (each fires once per armed count): `drop[(repo, path)] = n` sends the
headers and n bytes of a GET, then closes the connection; `corrupt[(repo, path)] = k`
flips one byte of the next k GETs of that file; `hold[(repo, path)] = event` sends the first
half of that file's GETs, then waits for the event before the rest (a file caught half
downloaded, for as long as a test needs). `rate_bps` throttles every GET body (so progress
and cancel can be seen), `requests` records (method, path, Range).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from tests.support.stub_http import StubHandler, StubServer

LFS_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth", ".npz")


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a file's content (the Hub's blobId / ETag of a non-LFS file)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Repo:
    """One model repository: files per revision name (a branch name or the commit itself)."""

    files: dict[str, bytes]
    commit: str
    gated: bool = False
    token: str = ""  # the token that opens a gated repo
    revisions: dict[str, str] = field(default_factory=dict)  # other branch name -> commit of `files`

    def resolve(self, revision: str) -> bool:
        return revision in ("main", self.commit) or revision in self.revisions


def repo_from_dir(model_dir: Path, commit_seed: str = "", **kwargs: object) -> Repo:
    """A repo holding every file of a model directory; the commit id derives from its content."""
    files = {p.relative_to(model_dir).as_posix(): p.read_bytes() for p in sorted(model_dir.rglob("*")) if p.is_file()}
    h = hashlib.sha1(commit_seed.encode())
    for name, data in files.items():
        h.update(name.encode() + hashlib.sha256(data).digest())
    return Repo(files=files, commit=h.hexdigest(), **kwargs)  # type: ignore[arg-type]


class HubStandIn(StubServer):
    """The server; start with `start()`, point HF_ENDPOINT at `url`, `close()` at the end."""

    allow_reuse_address = True

    def __init__(self, repos: dict[str, Repo] | None = None, host: str = "127.0.0.1", port: int = 0) -> None:
        self.repos: dict[str, Repo] = dict(repos or {})
        self.drop: dict[tuple[str, str], int] = {}
        self.corrupt: dict[tuple[str, str], int] = {}
        self.hold: dict[tuple[str, str], threading.Event] = {}
        self.rate_bps: float | None = None
        self.listed_size: dict[tuple[str, str], int] = {}  # a lying listing: (repo, file) -> the size it says
        self.requests: list[tuple[str, str, str]] = []
        self.lock = threading.Lock()
        super().__init__(_Handler, host, port)

    def gets(self, repo: str, path: str) -> list[str]:
        """The Range headers ("" for none) of every GET of one file so far."""
        with self.lock:
            return [rng for method, p, rng in self.requests if method == "GET" and p == f"/{repo}/resolve/" + path]

    def take(self, faults: dict[tuple[str, str], int], key: tuple[str, str]) -> int | None:
        """Consume one arming of a fault (None when not armed)."""
        with self.lock:
            value = faults.get(key)
            if value is None:
                return None
            if faults is self.corrupt:
                if value <= 1:
                    del faults[key]
                else:
                    faults[key] = value - 1
                return 1
            del faults[key]
            return value


class _Handler(StubHandler):
    server: HubStandIn
    protocol_version = "HTTP/1.1"

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None, head: bool = False) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str, head: bool = False) -> None:
        body = json.dumps({"error": message}).encode()
        self._send(status, body, {"Content-Type": "application/json", "X-Error-Code": code,
                                  "X-Error-Message": message}, head)

    def _route(self, head: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        with self.server.lock:
            self.server.requests.append((self.command, path, self.headers.get("Range", "")))
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            return self._info("/".join(parts[2:4]), parts[5] if len(parts) >= 6 and parts[4] == "revision" else "main")
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._file("/".join(parts[:2]), parts[3], "/".join(parts[4:]), head)
        self._error(404, "EntryNotFound", f"no route {path}", head)

    def _info(self, repo_id: str, revision: str) -> None:
        repo = self.server.repos.get(repo_id)
        if repo is None:
            return self._error(404, "RepoNotFound", f"Repository Not Found for url: {self.path}.")
        if not repo.resolve(revision):
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        siblings = []
        for name, data in repo.files.items():
            size = self.server.listed_size.get((repo_id, name), len(data))
            entry: dict[str, object] = {"rfilename": name, "size": size, "blobId": git_blob_sha1(data)}
            if name.endswith(LFS_SUFFIXES):
                entry["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": size, "pointerSize": 134}
            siblings.append(entry)
        body = {"id": repo_id, "modelId": repo_id, "sha": repo.commit, "private": False,
                "gated": "manual" if repo.gated else False, "disabled": False, "siblings": siblings,
                "tags": ["mlx"], "library_name": "mlx"}
        self._send(200, json.dumps(body).encode(), {"Content-Type": "application/json"})

    def _file(self, repo_id: str, revision: str, name: str, head: bool) -> None:
        repo = self.server.repos.get(repo_id)
        if repo is None:
            return self._error(404, "RepoNotFound", f"Repository Not Found for url: {self.path}.", head)
        if repo.gated and self.headers.get("Authorization", "") != f"Bearer {repo.token}":
            return self._error(401, "GatedRepo", f"Access to model {repo_id} is restricted. You must have access "
                                                 "to it and be authenticated to access it. Please log in.", head)
        if not repo.resolve(revision):
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}", head)
        data = repo.files.get(name)
        if data is None:
            return self._error(404, "EntryNotFound", f"{name} does not exist on {revision}", head)
        lfs = name.endswith(LFS_SUFFIXES)
        etag = hashlib.sha256(data).hexdigest() if lfs else git_blob_sha1(data)
        headers = {"X-Repo-Commit": repo.commit, "ETag": f'"{etag}"', "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream"}
        start = 0
        rng = self.headers.get("Range", "")
        if rng.startswith("bytes=") and not head:
            start = int(rng[6:].split("-")[0] or 0)
            if start >= len(data):
                return self._error(416, "RangeNotSatisfiable", f"range {rng} of {len(data)} bytes")
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        if head:
            return self._send(200, data, headers, head=True)
        body = data[start:]
        key = (repo_id, name)
        if self.server.take(self.server.corrupt, key) and body:
            mid = len(body) // 2
            body = body[:mid] + bytes([body[mid] ^ 0xFF]) + body[mid + 1:]
        cut = self.server.take(self.server.drop, key)
        self.send_response(206 if start else 200)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        body = body[:cut] if cut is not None else body
        gate = self.server.hold.get(key)
        if gate is not None:
            half = len(body) // 2
            self._write(body[:half])
            self.wfile.flush()
            gate.wait(120)
            body = body[half:]
        self._write(body)
        if cut is not None:
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)  # mid-file: the client sees the connection end early

    def _write(self, body: bytes) -> None:
        rate = self.server.rate_bps
        step = max(1024, int(rate / 20)) if rate else len(body) or 1
        try:
            for i in range(0, len(body), step):
                self.wfile.write(body[i:i + step])
                if rate:
                    time.sleep(step / rate)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client stopped the download (a cancel): not the hub's error

    def do_GET(self) -> None:
        self._route(head=False)

    def do_HEAD(self) -> None:
        self._route(head=True)
