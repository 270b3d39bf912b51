"""Hub downloads through the real huggingface_hub client, against the Hub stand-in.

No hub is reachable from here: `tests/support/hub.py` serves the test model with the routes
and headers huggingface_hub uses (model info with file metadata, HEAD/GET resolve with
X-Repo-Commit, ETag, Content-Length, Range). The agent reaches it through HF_ENDPOINT.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from orchestrator.agent.client import AgentError
from orchestrator.proc import wait_until
from tests.support.files import sha256sums
from tests.support.hub import HubStandIn, Repo, repo_from_dir


@pytest.fixture(scope="module")
def one_file_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~19 MB in ONE safetensors file: room to interrupt a file in its middle."""
    from orchestrator.testmodels.llama import make_test_model

    return make_test_model(tmp_path_factory.mktemp("hub") / "model", layers=8, hidden=256)


@pytest.fixture
def hub(test_model_dir: Path, one_file_model: Path):
    files = repo_from_dir(test_model_dir).files
    repos = {
        "org/tiny": repo_from_dir(test_model_dir),
        "org/big": repo_from_dir(one_file_model),
        "org/gated": repo_from_dir(test_model_dir, "gated", gated=True, token="hf_secret"),
        "org/torch": Repo(files={"config.json": files["config.json"], "pytorch_model.bin": b"\0" * 1000,
                                 "tokenizer.json": files["tokenizer.json"]}, commit="1" * 40),
    }
    h = HubStandIn(repos).start()
    yield h
    h.close()


@pytest.fixture
def start_node(spawn_agent, hub, tmp_path):
    def start(name: str = "b"):
        return spawn_agent(name, env=hub_env(hub, tmp_path))
    return start


def hub_env(hub: HubStandIn, tmp_path: Path) -> dict[str, str]:
    return {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_TOKEN": "", "HF_HUB_ETAG_TIMEOUT": "5"}


def test_listing_before_anything_is_fetched(start_node, hub, test_model_dir):
    b = start_node()
    listing = b.client.hub_files("org/tiny")
    want = {p.relative_to(test_model_dir).as_posix(): p.stat().st_size
            for p in test_model_dir.rglob("*") if p.is_file()}
    assert {f.path: f.size for f in listing.files} == want
    assert listing.total_bytes == sum(want.values()) and listing.commit == hub.repos["org/tiny"].commit
    assert listing.mlx and listing.unsupported_reason is None and listing.model_type == "llama" and listing.fits
    assert not hub.gets("org/tiny", f"{listing.commit}/model.safetensors")  # only config.json was read
    assert not (b.models_dir / "tiny").exists()

    gated = b.client.hub_files("org/gated")
    assert gated.gated and not gated.token
    torch = b.client.hub_files("org/torch")
    assert not torch.mlx and "PyTorch weights only" in torch.reason
    with pytest.raises(AgentError) as missing:
        b.client.hub_files("org/absent")
    assert missing.value.code == "hub_not_found" and "no repository org/absent" in missing.value.message


def test_download_resumes_a_dropped_connection_and_refetches_a_corrupted_byte(start_node, hub, one_file_model):
    b = start_node()
    commit = hub.repos["org/big"].commit
    hub.drop[("org/big", "model.safetensors")] = 5_000_000  # the server hangs up mid-file
    hub.corrupt[("org/big", "tokenizer.json")] = 1  # a small (git) file: checked by its blob id
    b.client.fetch("big", {"kind": "hf", "repo_id": "org/big"})
    done = b.client.wait_download("big", timeout=90)
    assert done.state == "done", (done, b.output())
    assert sha256sums(b.models_dir / "big") == sha256sums(one_file_model)
    ranges = hub.gets("org/big", f"{commit}/model.safetensors")
    # resumed where huggingface_hub's last whole 1 MiB chunk ended, not restarted
    assert ranges == ["", f"bytes={4 << 20}-"], ranges
    assert len(hub.gets("org/big", f"{commit}/tokenizer.json")) == 2  # the corrupted copy was fetched again
    assert "download.corrupt_file" in b.output(200)
    assert not (b.models_dir / "big" / ".cache").exists()
    info = b.client.model("big")
    assert info.supported and info.manifest.total_bytes == done.total_bytes


def test_refusals_are_clear_and_leave_nothing(start_node, hub):
    b = start_node()
    for model_id, repo, code, words in (("g", "org/gated", "hub_gated", "gated repository"),
                                        ("t", "org/torch", "not_mlx", "not an MLX repository"),
                                        ("m", "org/absent", "hub_not_found", "no repository org/absent")):
        b.client.fetch(model_id, {"kind": "hf", "repo_id": repo})
        failed = b.client.wait_download(model_id, timeout=60)
        assert failed.state == "failed" and failed.error_code == code and words in failed.error, failed
        assert not (b.models_dir / model_id).exists() and not (b.models_dir / ".partial" / model_id).exists()
    b.client.fetch("r", {"kind": "hf", "repo_id": "org/tiny", "revision": "no-such-branch"})
    failed = b.client.wait_download("r", timeout=60)
    assert failed.error_code == "hub_not_found" and "no revision 'no-such-branch'" in failed.error
    assert not any(m == "GET" and "/resolve/" in p and "model.safetensors" in p for m, p, _ in hub.requests)


def test_download_resumes_after_an_agent_restart(start_node, hub, one_file_model):
    b = start_node()
    hub.rate_bps = 3e6  # ~19 MB: several seconds, so the agent stops mid-file
    b.client.fetch("big", {"kind": "hf", "repo_id": "org/big"})
    wait_until(lambda: b.client.progress("big").transferred_bytes > 2_000_000, 60, message="bytes to arrive")
    assert b.stop(signal.SIGTERM) == 0
    hub.rate_bps = None
    b.restart()
    with pytest.raises(AgentError):
        b.client.progress("big")  # a restarted agent has no job: the control plane fetches again
    b.client.fetch("big", {"kind": "hf", "repo_id": "org/big"})
    done = b.client.wait_download("big", timeout=90)
    assert done.state == "done", (done, b.output())
    assert sha256sums(b.models_dir / "big") == sha256sums(one_file_model)
    resumed = [r for m, p, r in hub.requests if m == "GET" and p.endswith(".safetensors") and r]
    assert resumed and done.transferred_bytes < done.total_bytes, (resumed, done)


def test_delete_refused_while_in_use_and_done_otherwise(start_node, hub):
    b = start_node()
    b.client.fetch("tiny", {"kind": "hf", "repo_id": "org/tiny"})
    assert b.client.wait_download("tiny", timeout=60).state == "done"
    b.client.delete_model("tiny")
    assert not (b.models_dir / "tiny").exists() and "tiny" not in [m.id for m in b.client.models()]
    with pytest.raises(AgentError) as gone:
        b.client.delete_model("tiny")
    assert gone.value.status == 404


def test_a_manifest_from_the_control_plane_is_checked_too(start_node, hub):
    b = start_node()
    b.client.fetch("tiny", {"kind": "hf", "repo_id": "org/tiny"})
    assert b.client.wait_download("tiny", timeout=60).state == "done"
    manifest = b.client.model("tiny").manifest
    b.client.fetch("tiny2", {"kind": "hf", "repo_id": "org/tiny"}, manifest)
    assert b.client.wait_download("tiny2", timeout=60).state == "done"
    wrong = manifest.model_copy(update={"files": {**manifest.files, "config.json": manifest.files["tokenizer.json"]}})
    b.client.fetch("tiny3", {"kind": "hf", "repo_id": "org/tiny"}, wrong)
    failed = b.client.wait_download("tiny3", timeout=60)
    assert failed.state == "failed" and failed.error_code == "mismatch" and "config.json" in failed.mismatched


def test_a_hub_that_sends_more_than_it_listed_writes_no_more_and_leaves_nothing(start_node, hub):
    """Issue 20, item 5: a hub whose listing said 1,000 bytes streamed 200 MiB per file, all of
    it written and kept on disk as `hub_unreachable`. Now every byte written is capped by the
    listed size (what the job was admitted with) and the failed partial files are removed."""
    b = start_node()
    hub.listed_size[("org/big", "model.safetensors")] = 1000
    b.client.fetch("liar", {"kind": "hf", "repo_id": "org/big"})
    failed = b.client.wait_download("liar", timeout=90)
    assert failed.state == "failed" and failed.error_code == "oversized", failed
    assert "model.safetensors" in failed.error and "1000 bytes" in failed.error
    leftovers = [p for p in b.models_dir.rglob("*") if p.is_file() and "liar" in p.as_posix()]
    assert leftovers == [], leftovers


def test_the_listing_preview_never_downloads_a_huge_config(start_node, hub, test_model_dir):
    """Issue 20, item 5: the preview downloaded a 198 MiB config.json into the system temp
    directory. A config.json listed (or sent) over 1 MiB is refused without being kept."""
    b = start_node()
    files = dict(hub.repos["org/tiny"].files)
    files["config.json"] = files["config.json"].rstrip()[:-1] + b', "pad": "' + b"x" * (2 << 20) + b'"}'
    hub.repos["org/hugeconfig"] = Repo(files=files, commit="2" * 40)
    listing = b.client.hub_files("org/hugeconfig")
    assert not listing.mlx and "too large" in listing.reason, listing
    hub.listed_size[("org/hugeconfig", "config.json")] = 500  # and when the listing lies about it
    listing = b.client.hub_files("org/hugeconfig")
    assert not listing.mlx and "too large" in listing.reason, listing


def test_a_hub_file_named_like_the_agents_partial_file_cannot_take_its_place(start_node, hub, test_model_dir):
    """Issue 20, item 8: a hub file `x.part` collided with the agent's own partial file of `x`;
    the job reported done with the file missing. Such a name is skipped from the listing (the
    agent's partial files own it): the model arrives whole, the stray file is never fetched."""
    repo = repo_from_dir(test_model_dir, "parts")
    repo.files["model.safetensors.part"] = b"not the agent's partial file"
    hub.repos["org/parts"] = repo
    b = start_node()
    b.client.fetch("parts", {"kind": "hf", "repo_id": "org/parts"})
    done = b.client.wait_download("parts", timeout=60)
    assert done.state == "done", done
    assert sha256sums(b.models_dir / "parts") == sha256sums(test_model_dir)  # every file, none missing
    assert not any("model.safetensors.part" in p for m, p, _ in hub.requests if m == "GET" and "/resolve/" in p)
