"""Prepare: get one model, byte-identical, onto every selected node (the I/O edge).

The reference manifest (per-file size and sha256) comes from a node that already has the
model. Each selected node is checked against it — Present, Needs download, or Mismatch —
and every node that lacks it fetches it over the LAN from a peer that has it (the peer
that served fastest so far first). Progress is posted as events until all are Present
and verified, or a node fails with its reason.
"""

from __future__ import annotations

import time
from typing import Callable

from ..agent.client import AgentClient, AgentError
from ..agent.schemas import Manifest
from . import events as ev
from .state import NodePreparation, Preparation

Post = Callable[[ev.Event], None]
STATUS = {"present": "present", "needs_download": "needs_download", "mismatch": "mismatch"}


class PrepareFailed(RuntimeError):
    """Preparation cannot proceed; the message names the model or node."""


def reference_manifest(model_id: str, holders: dict[str, AgentClient]) -> tuple[str, Manifest]:
    """(node id, manifest) of the first node that has the model as a valid MLX directory."""
    for node_id, client in holders.items():
        try:
            info = client.model(model_id)
        except AgentError:
            continue
        if info.mlx_format and info.manifest is not None:
            return node_id, info.manifest
    raise PrepareFailed(f"no registered node has model {model_id!r}: add it to one node's models directory")


def fastest_first(peers: dict[str, AgentClient], probes: int = 3) -> list[str]:
    """Peers ordered by measured round trip (best of a few identity probes); unreachable ones last."""
    def rtt(client: AgentClient) -> float:
        best = float("inf")
        for _ in range(probes):
            start = time.perf_counter()
            try:
                client.identity()
            except AgentError:
                return float("inf")
            best = min(best, time.perf_counter() - start)
        return best

    timed = {n: rtt(c) for n, c in peers.items()}
    return sorted(peers, key=lambda n: timed[n])


def prepare(model_id: str, targets: dict[str, AgentClient], everyone: dict[str, AgentClient], post: Post,
            names: dict[str, str], poll_s: float = 0.25, timeout_s: float = 3600.0) -> bool:
    """Run the preparation; posts PreparationStarted/Progressed/Finished. Returns whether all are Present."""
    post(ev.PreparationStarted(preparation=Preparation(
        model_id=model_id, nodes=tuple(NodePreparation(node_id=n) for n in targets))))
    try:
        source_id, manifest = reference_manifest(model_id, {**targets, **everyone})
        states = {n: _check(n, model_id, c, manifest) for n, c in targets.items()}
        for n, st in states.items():
            post(ev.PreparationProgressed(node=st))
        holders = [source_id] + [n for n, st in states.items() if st.status == "present" and n != source_id]
        peers = fastest_first({n: everyone.get(n) or targets[n] for n in holders})
        downloading: dict[str, str] = {}
        for n, st in states.items():
            if st.status in ("needs_download", "mismatch"):
                peer_id = peers[0]
                peer = everyone.get(peer_id) or targets[peer_id]
                targets[n].fetch_from_peer(model_id, peer, manifest)
                downloading[n] = peer_id
                post(ev.PreparationProgressed(node=st.model_copy(update={
                    "status": "downloading", "verdict": st.status, "source": names.get(peer_id, peer_id),
                    "detail": f"{'replacing mismatched files' if st.status == 'mismatch' else 'copying'} "
                              f"from {names.get(peer_id, peer_id)}"})))
        deadline = time.monotonic() + timeout_s
        while downloading:
            if time.monotonic() > deadline:
                raise PrepareFailed(f"downloads still running after {timeout_s:.0f} s")
            time.sleep(poll_s)
            for n in list(downloading):
                info = targets[n].progress(model_id)
                node = NodePreparation(node_id=n, status="downloading", verdict=states[n].status,
                                       done_bytes=info.done_bytes,
                                       total_bytes=info.total_bytes, rate_bps=info.rate_bps,
                                       source=names.get(downloading[n], downloading[n]),
                                       detail=info.current_file or "")
                if info.state == "running":
                    post(ev.PreparationProgressed(node=node))
                    continue
                del downloading[n]
                if info.state == "done":
                    node = _check(n, model_id, targets[n], manifest)  # verified again, by the node itself
                    node = node.model_copy(update={"verdict": states[n].status})
                else:
                    node = node.model_copy(update={"status": "failed", "detail": info.error or info.state})
                post(ev.PreparationProgressed(node=node))
                states[n] = node
        bad = [f"{names.get(n, n)}: {st.status} {st.detail}".strip() for n, st in states.items() if st.status != "present"]
        if bad:
            raise PrepareFailed("; ".join(bad))
    except (PrepareFailed, AgentError) as exc:
        post(ev.PreparationFinished(model_id=model_id, error=str(exc)))
        return False
    post(ev.PreparationFinished(model_id=model_id))
    return True


def _check(node_id: str, model_id: str, client: AgentClient, manifest: Manifest) -> NodePreparation:
    """Ask a node to compare its copy with the manifest (it re-hashes files that changed)."""
    try:
        result = client.check(model_id, manifest)
    except AgentError as exc:
        return NodePreparation(node_id=node_id, status="failed", detail=exc.message)
    detail = result.message
    if result.mismatched:
        detail = f"differs: {', '.join(result.mismatched[:5])}"
    return NodePreparation(node_id=node_id, status=STATUS[result.status], verdict=STATUS[result.status], detail=detail,
                           total_bytes=manifest.total_bytes,
                           done_bytes=manifest.total_bytes if result.status == "present" else 0)
