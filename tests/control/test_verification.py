"""Verified copies (control/rules/verification.py through transitions.apply, pure): what verifies a copy,
and that its badge changes only when its files do — not after another model's Prepare, gone
after a deletion or a changed manifest, and kept across a restart of the dashboard."""

from __future__ import annotations

from orchestrator.agent.schemas import FileEntry, Manifest
from orchestrator.control.rules import events as ev
from orchestrator.control.rules.download_events import (
    ModelDeletionFinished,
    ModelDeletionStarted,
    ModelDownloadProgressed,
)
from orchestrator.control.rules.download_state import NodeDownload
from orchestrator.control.rules.state import NodePreparation, Preparation, State
from orchestrator.control.rules.transitions import apply
from orchestrator.control.rules.verification import fingerprint, verified_copy, verified_holders
from orchestrator.control.store import load, save
from tests.support.builders import node


def manifest(sha: str = "a" * 64) -> Manifest:
    return Manifest(files={"model.safetensors": FileEntry(size=10, sha256=sha),
                           "config.json": FileEntry(size=2, sha256="b" * 64)})


def reported(state: State, node_id: str, models: dict[str, Manifest | None]) -> State:
    """The node's next report, listing these models with these manifests."""
    n = state.node(node_id)
    infos = [m.model_copy(update={"id": mid, "manifest": man}) for mid, man in models.items()
             for m in n.report.models[:1]]
    return apply(state, ev.NodeReported(node_id=node_id, report=n.report.model_copy(update={"models": infos}), at=1.0))


def base() -> State:
    s = State(nodes=(node("node-a", models=["smol"]), node("node-b", models=["smol"])))
    return reported(reported(s, "n0", {"smol": manifest()}), "n1", {"smol": manifest()})


def test_a_download_verified_on_arrival_is_verified_with_its_files_fingerprint():
    s = apply(base(), ModelDownloadProgressed(model_id="smol", node=NodeDownload(node_id="n0", status="verified",
                                                                               source="hub org/smol")))
    assert verified_holders(s, "smol") == {"n0"}
    info = next(m for m in s.node("n0").report.models if m.id == "smol")
    assert verified_copy(s, "smol", "n0").fingerprint == fingerprint(info)
    assert verified_copy(s, "smol", "n0").how == "downloaded from the hub, then verified"


def test_another_models_prepare_leaves_a_verified_copy_verified():
    prep = Preparation(model_id="smol", nodes=(NodePreparation(node_id="n1", status="checking"),))
    s = apply(apply(base(), ev.PreparationStarted(preparation=prep)),
              ev.PreparationProgressed(node=NodePreparation(node_id="n1", status="present", source="node-a")))
    assert verified_holders(s, "smol") == {"n1"}
    other = Preparation(model_id="tiny", nodes=(NodePreparation(node_id="n1"),))
    s = apply(s, ev.PreparationStarted(preparation=other))
    assert verified_holders(s, "smol") == {"n1"}  # the files did not change


def test_changed_files_or_a_deletion_make_it_not_verified():
    s = apply(base(), ev.CopyCheckFinished(model_id="smol", node_id="n0", ok=True))
    s = apply(s, ev.CopyCheckFinished(model_id="smol", node_id="n1", ok=True))
    assert verified_holders(s, "smol") == {"n0", "n1"}
    same = reported(s, "n0", {"smol": manifest()})
    assert verified_holders(same, "smol") == {"n0", "n1"}  # a report of the same files changes nothing
    changed = reported(s, "n0", {"smol": manifest("c" * 64)})
    assert verified_holders(changed, "smol") == {"n1"}
    deleted = apply(apply(s, ModelDeletionStarted(model_id="smol", node_id="n1")),
                    ModelDeletionFinished(model_id="smol", node_id="n1"))
    assert verified_holders(deleted, "smol") == {"n0"}
    gone = reported(s, "n1", {})  # deleted by hand: no longer listed
    assert verified_holders(gone, "smol") == {"n0"} and verified_holders(reported(gone, "n1", {"smol": manifest()}),
                                                                         "smol") == {"n0"}


def test_without_manifests_in_reports_the_file_count_and_bytes_tell_a_change():
    s = reported(reported(base(), "n0", {"smol": None}), "n1", {"smol": None})  # as agents report
    s = apply(s, ev.CopyCheckFinished(model_id="smol", node_id="n0", ok=True))
    assert verified_holders(reported(s, "n0", {"smol": None}), "smol") == {"n0"}
    n = s.node("n0")
    bigger = n.report.model_copy(update={"models": [m.model_copy(update={"total_bytes": m.total_bytes + 1})
                                                    for m in n.report.models]})
    s = apply(s, ev.NodeReported(node_id="n0", report=bigger, at=2.0))
    assert verified_holders(s, "smol") == set()


def test_a_failed_verify_says_why_and_drops_the_record():
    s = apply(base(), ev.CopyCheckFinished(model_id="smol", node_id="n0", ok=True))
    s = apply(apply(s, ev.CopyCheckStarted(model_id="smol", node_id="n0")),
              ev.CopyCheckFinished(model_id="smol", node_id="n0", ok=False,
                                   message="model.safetensors: sha256 differs"))
    assert verified_holders(s, "smol") == set()
    assert [(c.phase, c.message) for c in s.checks] == [("failed", "model.safetensors: sha256 differs")]


def test_verified_copies_survive_a_restart_and_stay_while_the_files_do(tmp_path):
    s = apply(base(), ev.CopyCheckFinished(model_id="smol", node_id="n0", ok=True))
    save(tmp_path, s)
    restarted = load(tmp_path)  # reports are gone until the nodes report again
    assert verified_holders(restarted, "smol") == set()
    again = reported(restarted.model_copy(update={"nodes": s.nodes}), "n0", {"smol": manifest()})
    assert verified_holders(again, "smol") == {"n0"}
