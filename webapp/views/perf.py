"""The link matrix and a plan's predicted performance, as the dashboard shows them (pure)."""

from __future__ import annotations

from typing import Any

from orchestrator.control.state import Node, State
from orchestrator.planner.predict import Performance


def _cell(node: Node, peer: Node) -> dict[str, Any] | None:
    """node's last measurement of its link to peer (None when never measured)."""
    if node.report is None:
        return None
    s = next((x for x in node.report.links if x.node_id == peer.id), None)
    if s is None:
        return None
    if s.error:
        return {"error": s.error, "text": "failed", "title": s.error}
    rtt = s.rtt_ms if s.rtt_ms is not None else s.http_rtt_ms
    gbps = (s.bandwidth_Bps or 0) * 8 / 1e9
    return {"rtt_ms": rtt, "http_rtt_ms": s.http_rtt_ms, "gbps": gbps, "interface": s.interface, "at": s.at,
            "text": f"{rtt:.2f} ms · {gbps:.2f} Gbit/s" if rtt is not None else f"{gbps:.2f} Gbit/s",
            "title": f"round trip {rtt:.3f} ms (HTTP {s.http_rtt_ms:.2f} ms), throughput {gbps:.2f} Gbit/s"
                     f"{', via ' + s.interface if s.interface else ''}" if rtt is not None and s.http_rtt_ms else ""}


def link_matrix(state: State, node_ids: list[str] | None = None) -> dict[str, Any]:
    """Rows measure from, columns to: {nodes: [names], ids, rows: [[cell or None]]} over the
    given nodes (default: every registered node)."""
    nodes = [n for n in state.nodes if node_ids is None or n.id in node_ids]
    if node_ids is not None:
        nodes.sort(key=lambda n: node_ids.index(n.id))
    rows = [[None if a.id == b.id else _cell(a, b) for b in nodes] for a in nodes]
    return {"nodes": [n.name for n in nodes], "ids": [n.id for n in nodes], "rows": rows,
            "measured": any(c for r in rows for c in r)}


def performance_view(perf: Performance | None) -> dict[str, Any] | None:
    """The plan's predicted performance (planner/predict.Performance) in words and numbers."""
    if perf is None:
        return None
    agg = [{"requests": p.x, "tps": f"{p.y:.1f}"} for p in perf.aggregate_tps]
    ttft = [{"prompt": f"{p.x // 1024}k" if p.x % 1024 == 0 else str(p.x), "seconds": f"{p.y:.2f}"}
            for p in perf.ttft_s]
    return {"decode_1": f"{perf.decode_tps_1:.1f}", "ms_per_token": f"{perf.ms_per_token_1:.1f}",
            "compute_ms": f"{perf.compute_ms_1:.1f}", "aggregate": agg, "ttft": ttft,
            "bottleneck": perf.bottleneck, "single_node": perf.single_node,
            "automatic": perf.automatic, "note": perf.timing_note,
            "boundaries": [{"source": b.source, "target": b.target, "link": b.link, "interface": b.interface,
                            "measured": b.measured, "ms": f"{b.ms_per_token:.2f}"} for b in perf.boundaries]}
