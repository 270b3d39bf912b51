"""The Models tab's rules (`model_rules`, reached through `decide`) as tables: a state and a
download, cancel or delete command in, events and effects (or a refusal) out. No process, no
thread, no hub: the listing a caller would fetch is a value here. The last test runs the
deletion's worker in a headless Orchestrator (no agents: a stand-in client at that seam)."""

from __future__ import annotations

import pytest

from orchestrator.agent.client import AgentError
from orchestrator.agent.hub import HubFile, HubListing
from orchestrator.agent.schemas import ModelInfo
from orchestrator.control.rules import events as ev
from orchestrator.control.rules.commands import (
    CancelDownload,
    CommandRefused,
    DeleteModel,
    DownloadModel,
    LaunchSingle,
    PrepareModel,
    ResumeDownload,
)
from orchestrator.control.rules.decide import decide
from orchestrator.control.rules.download_events import ModelDeletionFinished, ModelDownloadFinished
from orchestrator.control.rules.download_state import HubRef, ModelDownload, NodeDownload
from orchestrator.control.rules.model_rules import CancelDownloadWork, DeleteModelFiles, RunDownload
from orchestrator.control.rules.transitions import apply
from tests.support.control_states import BASE, MODEL, SERVING, effect_types, kinds, session

MB = 10**6


def listing(total: int = 300 * MB, **kw) -> HubListing:
    fields = dict(repo_id="org/tiny-4bit", revision="main", commit="c0ffee", total_bytes=total, mlx=True,
                  files=[HubFile(path="model.safetensors", size=total, sha256="ab" * 32)],
                  disk_free_bytes=10**11, fits=True)
    return HubListing(**{**fields, **kw})


def download_cmd(nodes=("n0", "n1"), model_id: str = "tiny-4bit", **kw) -> DownloadModel:
    return DownloadModel(model_id, tuple(nodes), listing(**kw), now=5.0)


def running(model_id: str = "tiny-4bit", nodes=("n0", "n1")) -> ModelDownload:
    return ModelDownload(model_id=model_id, hub=HubRef(repo_id="org/tiny-4bit"),
                         nodes=tuple(NodeDownload(node_id=n) for n in nodes))


def with_download(state, dl: ModelDownload):
    return state.model_copy(update={"downloads": state.downloads + (dl,)})


def unreachable(state, node_id: str):
    return state.model_copy(update={"nodes": tuple(n.model_copy(update={"status": "unreachable", "error": "timed out"})
                                                   if n.id == node_id else n for n in state.nodes)})


def disk(state, node_id: str, free: int):
    return state.model_copy(update={"nodes": tuple(
        n.model_copy(update={"report": n.report.model_copy(update={"disk_free_bytes": free})}) if n.id == node_id
        else n for n in state.nodes)})


def holding(state, node_id: str, model_id: str):
    return state.model_copy(update={"nodes": tuple(
        n.model_copy(update={"report": n.report.model_copy(
            update={"models": [ModelInfo(id=model_id, mlx_format=True)]})})
        if n.id == node_id else n for n in state.nodes)})


REFUSED = [
    ("no target node", BASE, download_cmd(nodes=()), "choose at least one node"),
    ("already downloading", with_download(BASE, running()), download_cmd(), "already being downloaded"),
    ("unknown node", BASE, download_cmd(nodes=("n0", "nobody")), "node 'nobody' is not registered"),
    ("unreachable node", unreachable(BASE, "n1"), download_cmd(), "node-b is unreachable (timed out)"),
    ("name taken on a target", holding(BASE, "n1", "tiny-4bit"), download_cmd(),
     "node-b already has a model named tiny-4bit"),
    ("not an MLX repository", BASE, download_cmd(mlx=False, reason="no config.json"),
     "org/tiny-4bit is not an MLX model: no config.json"),
    ("gated without a token", BASE, download_cmd(gated=True, token=False), "gated repository and the node has no"),
    ("too little disk on the second target", disk(BASE, "n1", 200 * MB), download_cmd(),
     "not enough disk space on node-b: org/tiny-4bit needs 300.0 MB (+64 MiB margin), 200.0 MB are free"),
    ("cancel what is not running", BASE, CancelDownload("tiny-4bit"), "no download of tiny-4bit is running"),
    ("cancel what already finished", with_download(BASE, running().model_copy(update={"phase": "done"})),
     CancelDownload("tiny-4bit"), "no download of tiny-4bit is running"),
    ("delete what a session serves", SERVING, DeleteModel(MODEL, "n1"),
     "smol on node-b is used by session smol-2stage: stop it first"),
    ("delete what a download writes", with_download(BASE, running(MODEL)), DeleteModel(MODEL, "n0"),
     "smol is being downloaded to node-a: cancel the download first"),
    ("delete from an unreachable node", unreachable(BASE, "n0"), DeleteModel(MODEL, "n0"), "node-a is unreachable"),
]


@pytest.mark.parametrize("state, command, message", [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_a_broken_rule_is_refused_with_its_reason(state, command, message):
    with pytest.raises(CommandRefused, match=message.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")):
        decide(state, command)


def test_a_download_starts_once_every_target_can_take_it():
    d = decide(BASE, download_cmd())
    assert kinds(d) == ["model_download_started"] and effect_types(d) == ["RunDownload"]
    dl = d.events[0].download
    assert (dl.model_id, dl.hub.repo_id, dl.commit, dl.total_bytes, dl.files, dl.started_at) == \
        ("tiny-4bit", "org/tiny-4bit", "c0ffee", 300 * MB, 1, 5.0)
    assert [n.node_id for n in dl.nodes] == ["n0", "n1"]
    assert [n.detail for n in dl.nodes] == ["", "waiting for the hub download"]  # one hub download, then copies
    assert d.effects == (RunDownload(dl),)


def test_a_second_download_of_the_same_model_is_refused_once_the_first_is_applied():
    first = decide(BASE, download_cmd())
    state = apply(BASE, first.events[0])
    with pytest.raises(CommandRefused, match="already being downloaded"):
        decide(state, download_cmd(nodes=("n1",)))
    finished = apply(state, ModelDownloadFinished(model_id="tiny-4bit", phase="failed", error="x"))
    assert kinds(decide(finished, download_cmd())) == ["model_download_started"]  # after it ended: again


def test_a_download_with_another_name_is_not_blocked_by_a_taken_one():
    state = holding(BASE, "n1", "tiny-4bit")
    assert effect_types(decide(state, download_cmd(model_id="tiny-4bit-b"))) == ["RunDownload"]


def test_resume_follows_a_download_again_unless_one_runs():
    dl = running()
    d = decide(BASE, ResumeDownload(dl))
    assert kinds(d) == ["model_download_started"] and d.effects == (RunDownload(dl),)
    assert decide(with_download(BASE, dl), ResumeDownload(dl)).events == ()
    assert decide(BASE, ResumeDownload(dl.model_copy(update={"phase": "done"}))).effects == ()


def test_cancel_names_the_running_download():
    d = decide(with_download(BASE, running()), CancelDownload("tiny-4bit"))
    assert d.events == () and d.effects == (CancelDownloadWork("tiny-4bit"),)


def test_a_deletion_blocks_a_second_one_and_any_session_of_that_model_there_until_it_ends():
    d = decide(BASE, DeleteModel(MODEL, "n1"))
    assert kinds(d) == ["model_deletion_started"] and d.effects == (DeleteModelFiles(MODEL, "n1"),)
    state = apply(BASE, d.events[0])
    with pytest.raises(CommandRefused, match="smol is already being deleted from node-b"):
        decide(state, DeleteModel(MODEL, "n1"))
    with pytest.raises(CommandRefused, match="smol is being deleted from node-b"):
        decide(state, LaunchSingle(MODEL, "n1", "s9", 1.0))
    with pytest.raises(CommandRefused, match="smol is being deleted from node-b"):
        decide(state, PrepareModel(MODEL, ("n0", "n1")))
    assert effect_types(decide(state, LaunchSingle(MODEL, "n0", "s9", 1.0))) == ["StartLaunch"]  # another node
    ended = apply(state, ModelDeletionFinished(model_id=MODEL, node_id="n1", error="409: model_in_use"))
    assert [(x.phase, x.error) for x in ended.deletions] == [("failed", "409: model_in_use")]
    assert effect_types(decide(ended, DeleteModel(MODEL, "n1"))) == ["DeleteModelFiles"]


def test_a_finished_deletion_nobody_started_changes_nothing():
    assert apply(BASE, ModelDeletionFinished(model_id=MODEL, node_id="n1")) is BASE


def test_a_session_that_ended_no_longer_blocks_a_deletion():
    state = BASE.model_copy(update={"sessions": (session(phase="failed"),)})
    assert effect_types(decide(state, DeleteModel(MODEL, "n1"))) == ["DeleteModelFiles"]


# --- the deletion's worker always ends it ---------------------------------------------------
class _Agent:
    """Stands in for a node's agent client (the one seam here): its delete fails as `error` says."""

    def __init__(self, error: BaseException | None) -> None:
        self.error = error

    def delete_model(self, model_id: str) -> None:
        if self.error is not None:
            raise self.error

    def report(self):
        raise ValueError("a report this dashboard cannot read")  # what _refresh meets after a delete


@pytest.fixture
def orch(tmp_path):
    from orchestrator.control.core import Orchestrator
    from orchestrator.registrar import ConfigFileRegistrar

    o = Orchestrator(tmp_path / "state", ConfigFileRegistrar(tmp_path / "router.yaml")).start(look=False)
    for n in BASE.nodes:
        o.post(ev.NodeRegistered(node=n))
    o.wait(lambda st: len(st.nodes) == 2, 5)
    yield o
    o.stop()


@pytest.mark.parametrize("error, refused", [
    (None, None),  # deleted; the report after it failed: the deletion still ends, without an error
    (AgentError(409, "model_in_use: a process uses it"), "delete smol on node-b: model_in_use: a process uses it"),
    (RuntimeError("a bug"), "delete smol on node-b: RuntimeError: a bug"),
])
def test_a_deletion_always_ends_and_says_why_it_failed(orch, monkeypatch, error, refused):
    monkeypatch.setattr(orch, "agent", lambda node_id: _Agent(error))
    if refused is None:
        orch.models.delete(MODEL, "n1")
    else:
        with pytest.raises(CommandRefused, match=refused):
            orch.models.delete(MODEL, "n1")
    assert [(d.phase, d.error) for d in orch.state.deletions] == [("failed" if refused else "done", refused or "")]
    assert effect_types(decide(orch.state, DeleteModel(MODEL, "n1"))) == ["DeleteModelFiles"]  # not stuck
