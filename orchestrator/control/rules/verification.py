"""Which copies of a model the dashboard verified, and keeping that true while the files stay (pure).

A copy is Verified once the dashboard checked it file by file (sha256): a hub download or a
LAN copy verified on arrival, a Prepare that found it Present, or **Verify** on request. The
record keeps the fingerprint of what the node reports of the copy (its file count and bytes,
and the manifest's per-file sha256 when a report carries one), so it only changes when the
files do: a report that differs (files added, removed, resized, replaced) drops it, a deletion
drops it, and another model's Prepare leaves it alone. An edit that keeps every size is
only caught by the next Verify (reports carry no hashes).
"""

from __future__ import annotations

import hashlib

from orchestrator.agent.schemas import ModelInfo
from orchestrator.control.rules.state import State, VerifiedCopy


def fingerprint(info: ModelInfo) -> str:
    """What a report says of a copy's files: their count and bytes, and a digest of the manifest
    (path, size, sha256) when the report carries one."""
    text = f"{info.file_count} files, {info.total_bytes} B"
    if info.manifest is None:
        return text
    h = hashlib.sha256()
    for path in sorted(info.manifest.files):
        f = info.manifest.files[path]
        h.update(f"{path}\0{f.size}\0{f.sha256}\n".encode())
    return f"{text}, sha256 {h.hexdigest()[:16]}"


def reported_fingerprint(state: State, model_id: str, node_id: str) -> str | None:
    """The fingerprint of the node's reported copy, None when the node does not report the model."""
    node = state.node(node_id)
    if node is None or node.report is None:
        return None
    m = next((m for m in node.report.models if m.id == model_id), None)
    return None if m is None else fingerprint(m)


def record(state: State, model_id: str, node_id: str, how: str) -> State:
    """The state with this copy Verified (`how`: what checked it). Its fingerprint is the node's
    reported one, else filled in by the node's next report that lists it (reconcile)."""
    fp = reported_fingerprint(state, model_id, node_id) or ""
    entry = VerifiedCopy(model_id=model_id, node_id=node_id, fingerprint=fp, how=how)
    others = tuple(v for v in state.verified if (v.model_id, v.node_id) != (model_id, node_id))
    if len(others) < len(state.verified) and entry in state.verified:
        return state
    return state.model_copy(update={"verified": others + (entry,)})


def forget(state: State, model_id: str | None, node_id: str) -> State:
    """Without the record of this copy (every copy on the node when `model_id` is None)."""
    kept = tuple(v for v in state.verified if not (v.node_id == node_id and model_id in (None, v.model_id)))
    return state if len(kept) == len(state.verified) else state.model_copy(update={"verified": kept})


def reconcile(state: State, node_id: str) -> State:
    """After a node's report: a record waiting for its fingerprint gets it; one whose files the
    node now reports differently, or no longer at all once fingerprinted, is dropped."""
    changed, kept = False, []
    for v in state.verified:
        if v.node_id != node_id:
            kept.append(v)
            continue
        fp = reported_fingerprint(state, v.model_id, node_id)
        if fp is None:  # not listed: gone once it was seen (a record made before the listing waits)
            changed |= bool(v.fingerprint)
            if not v.fingerprint:
                kept.append(v)
        elif not v.fingerprint and fp:
            kept.append(v.model_copy(update={"fingerprint": fp}))
            changed = True
        elif v.fingerprint and fp != v.fingerprint:
            changed = True  # the files changed: no longer what was verified
        else:
            kept.append(v)
    return state.model_copy(update={"verified": tuple(kept)}) if changed else state


def verified_copy(state: State, model_id: str, node_id: str) -> VerifiedCopy | None:
    """The record that makes this copy Verified now (None: Not verified)."""
    v = next((v for v in state.verified if (v.model_id, v.node_id) == (model_id, node_id)), None)
    if v is None:
        return None
    fp = reported_fingerprint(state, model_id, node_id)
    return v if fp is not None and (not v.fingerprint or fp == v.fingerprint) else None


def verified_holders(state: State, model_id: str) -> set[str]:
    """Nodes whose reported copy of the model is Verified now."""
    return {v.node_id for v in state.verified if v.model_id == model_id and verified_copy(state, model_id, v.node_id)}
