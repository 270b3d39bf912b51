"""Prepare: get one model, byte-identical, onto every selected node (the I/O edge).

The reference manifest (per-file size and sha256) comes from a node that already has the
model. Each selected node is checked against it — Present, Needs download, or Mismatch —
and every node that lacks it fetches it over the LAN from a peer that has it (the peer
that served fastest so far first, every holder serving a share). When no node has it and a hub
repository is named, one node downloads it from the hub first. Progress is posted as events until all are Present
and verified, or a node fails with its reason.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from orchestrator.agent.client import AgentClient, AgentError
from orchestrator.agent.job_follower import JobCancelled, JobTimeout, follow_job
from orchestrator.agent.schemas import DownloadInfo, Manifest
from orchestrator.control.fetching import fetch_from_hub
from orchestrator.control.rules import events as ev
from orchestrator.control.rules.download_state import HubRef, NodeDownload
from orchestrator.control.rules.state import NodePreparation, Preparation
from orchestrator.units import format_bytes

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


def _from_hub(model_id: str, hub: HubRef, targets: dict[str, AgentClient], post: Post,
              names: dict[str, str]) -> tuple[str, Manifest]:
    """No node has the model: the first selected node downloads it from the hub (once)."""
    first = next(iter(targets))
    label = f"hub {hub.label}"

    def report(entry: NodeDownload) -> None:
        post(ev.PreparationProgressed(node=NodePreparation(
            node_id=first, status="downloading", verdict="needs_download", source=label, done_bytes=entry.done_bytes,
            total_bytes=entry.total_bytes, rate_bps=entry.rate_bps, detail=entry.detail or "downloading from the hub")))

    report(NodeDownload(node_id=first))
    info = fetch_from_hub(targets[first], model_id, hub, NodeDownload(node_id=first), report, threading.Event())
    if info.state != "done":
        raise PrepareFailed(f"{names.get(first, first)}: the download of {hub.label} from the hub failed: "
                            f"{info.error or info.state}")
    manifest = targets[first].model(model_id).manifest
    assert manifest is not None
    return first, manifest


def prepare(model_id: str, targets: dict[str, AgentClient], everyone: dict[str, AgentClient], post: Post,
            names: dict[str, str], hub: HubRef | None = None, poll_s: float = 0.25, timeout_s: float = 3600.0) -> bool:
    """Run the preparation; posts PreparationStarted/Progressed/Finished. Returns whether all are Present.

    When no registered node has the model and `hub` is given, the first selected node downloads it
    from the hub and the others copy it from there over the LAN (the table names each node's source).
    """
    looking = "looking for a node that holds the model, to check against"
    post(ev.PreparationStarted(preparation=Preparation(model_id=model_id, nodes=tuple(
        NodePreparation(node_id=n, detail=looking) for n in targets))))
    try:
        from_hub = None
        try:
            source_id, manifest = reference_manifest(model_id, {**targets, **everyone})
        except PrepareFailed:
            if hub is None:
                raise
            source_id, manifest = from_hub = _from_hub(model_id, hub, targets, post, names)
        reference = names.get(source_id, source_id)
        for n in targets:  # say what is being checked while the agents hash (seconds on a busy machine)
            post(ev.PreparationProgressed(node=NodePreparation(node_id=n, detail=(
                f"hashing its copy's {len(manifest.files)} files ({format_bytes(manifest.total_bytes)}), sha256"
                if n == source_id else f"comparing its copy with {reference}'s: {len(manifest.files)} files "
                f"({format_bytes(manifest.total_bytes)}), sha256 of each"))))
        # In parallel: a node without a copy answers at once, not after the others' hashing
        with ThreadPoolExecutor(max_workers=len(targets), thread_name_prefix="prepare-check") as pool:
            checks = {n: pool.submit(_check, n, model_id, c, manifest, "" if n == source_id else reference)
                      for n, c in targets.items()}
            states = {n: f.result() for n, f in checks.items()}
        if from_hub is not None and states[source_id].status == "present":
            states[source_id] = states[source_id].model_copy(update={
                "verdict": "needs_download", "source": f"hub {hub.label}"})
        for st in states.values():
            post(ev.PreparationProgressed(node=st))
        holders = [source_id] + [n for n, st in states.items() if st.status == "present" and n != source_id]
        peers = fastest_first({n: everyone.get(n) or targets[n] for n in holders})
        downloading: dict[str, str] = {}
        for n, st in states.items():
            if st.status in ("needs_download", "mismatch"):
                # Every holder serves a share of the bytes (files or ranges), fastest first.
                label = ", ".join(names.get(p, p) for p in peers)
                targets[n].fetch_from_peers(model_id, [everyone.get(p) or targets[p] for p in peers], manifest)
                downloading[n] = label
                post(ev.PreparationProgressed(node=st.model_copy(update={
                    "status": "downloading", "verdict": st.status, "source": label,
                    "detail": f"{'replacing mismatched files' if st.status == 'mismatch' else 'copying'} "
                              f"over the LAN from {label}"})))
        stop = threading.Event()  # one node's error ends the others' waits at once

        def follow_copy(n: str) -> None:
            def copying(info: DownloadInfo) -> NodePreparation:
                return NodePreparation(node_id=n, status="downloading", verdict=states[n].status,
                                       done_bytes=info.done_bytes, total_bytes=info.total_bytes,
                                       rate_bps=info.rate_bps, source=downloading[n], detail=info.current_file or "")

            try:
                info = follow_job(lambda: targets[n].progress(model_id), f"the copy to {names.get(n, n)}", timeout_s,
                                  poll_s, cancel=stop,
                                  on_running=lambda info: post(ev.PreparationProgressed(node=copying(info))))
            except JobCancelled:
                return
            except JobTimeout as exc:
                stop.set()
                raise PrepareFailed(str(exc)) from None
            except BaseException:
                stop.set()
                raise
            if info.state == "done":
                node = _check(n, model_id, targets[n], manifest, reference)  # verified again, by the node itself
                node = node.model_copy(update={"verdict": states[n].status, "source": downloading[n]})
            else:
                node = copying(info).model_copy(update={"status": "failed", "detail": info.error or info.state})
            post(ev.PreparationProgressed(node=node))
            states[n] = node

        if downloading:
            with ThreadPoolExecutor(max_workers=len(downloading), thread_name_prefix="prepare-copy") as pool:
                for future in [pool.submit(follow_copy, n) for n in downloading]:
                    future.result()
        bad = [f"{names.get(n, n)}: {st.status} {st.detail}".strip()
               for n, st in states.items() if st.status != "present"]
        if bad:
            raise PrepareFailed("; ".join(bad))
    except (PrepareFailed, AgentError) as exc:
        post(ev.PreparationFinished(model_id=model_id, error=str(exc)))
        return False
    # Fresh reports before "ready to launch": a preview or launch at once must see the model on
    # every node, not wait for the watcher's next round of reports.
    for n, client in targets.items():
        try:
            post(ev.NodeReported(node_id=n, report=client.report(), at=time.time()))
        except AgentError:
            pass  # the watcher's next round reports it
    post(ev.PreparationFinished(model_id=model_id))
    return True


def _check(node_id: str, model_id: str, client: AgentClient, manifest: Manifest, reference: str) -> NodePreparation:
    """Ask a node to compare its copy with the manifest of `reference`'s ("": its own, it is the
    reference) — it re-hashes files that changed; a Present copy says how it was verified."""
    try:
        result = client.check(model_id, manifest)
    except AgentError as exc:
        return NodePreparation(node_id=node_id, status="failed", detail=exc.message)
    detail = result.message
    if result.status == "present":
        detail = f"verified: every file's sha256 matches {reference}'s copy" if reference else \
            "verified: the reference copy, every file hashed (sha256)"
    if result.mismatched:
        detail = f"differs: {', '.join(result.mismatched[:5])}"
    return NodePreparation(node_id=node_id, status=STATUS[result.status], verdict=STATUS[result.status], detail=detail,
                           total_bytes=manifest.total_bytes,
                           done_bytes=manifest.total_bytes if result.status == "present" else 0)
