"""The link matrix and a plan's predicted performance, as the dashboard shows them (pure)."""

from __future__ import annotations

from typing import Any

from orchestrator.control.rules.state import Node, State
from orchestrator.planner.predict import Performance
from webapp.views.format import duration


def _cell(node: Node, peer: Node) -> dict[str, Any] | None:
    """node's last measurement of its link to peer (None when never measured)."""
    if node.report is None:
        return None
    s = next((x for x in node.report.links if x.node_id == peer.id), None)
    if s is None:
        return None
    if s.error:
        return {"error": s.error, "text": "failed", "title": s.error}
    rtt = s.plan_rtt_ms  # the figure the plan's boundary table takes too
    gbps = (s.bandwidth_Bps or 0) * 8 / 1e9
    # the planner takes the same figure (a lower bound when too fast to measure): one number for both tables
    rate = f"too fast to measure (≥ {gbps:.2f} Gbit/s)" if s.bandwidth_lower_bound else f"{gbps:.2f} Gbit/s"
    title = ""
    if rtt is not None and s.http_rtt_ms:
        title = (f"round trip {rtt:.3f} ms (HTTP {s.http_rtt_ms:.2f} ms), throughput {rate}"
                 f"{', via ' + s.interface if s.interface else ''}"
                 f"{', on the transport path to ' + s.path if s.path else ''}")
    return {"rtt_ms": rtt, "http_rtt_ms": s.http_rtt_ms, "gbps": gbps, "interface": s.interface, "at": s.at,
            "text": f"{rtt:.2f} ms · {rate}" if rtt is not None else rate, "title": title}


def link_matrix(state: State, node_ids: list[str] | None = None) -> dict[str, Any]:
    """Rows measure from, columns to: {nodes: [names], ids, rows: [[cell or None]]} over the
    given nodes (default: every registered node)."""
    nodes = [n for n in state.nodes if node_ids is None or n.id in node_ids]
    if node_ids is not None:
        nodes.sort(key=lambda n: node_ids.index(n.id))
    rows = [[None if a.id == b.id else _cell(a, b) for b in nodes] for a in nodes]
    return {"nodes": [n.name for n in nodes], "ids": [n.id for n in nodes], "rows": rows,
            "measured": any(c for r in rows for c in r)}


def seconds_text(seconds: float) -> str:
    """A predicted time: "0.42 s", "12.3 s", and from a minute on "15 min 42 s" (not "942.72 s")."""
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    return duration(seconds)


BATCH_SLACK = 1.25  # N requests yield at most about N x one request's rate (one step serves all N)


def inconsistency(perf: Performance) -> str:
    """Why the prediction contradicts itself ("" when it does not): N requests batched into one
    step cannot yield much more than N times one request's rate; a figure beyond that comes from
    layer timings disturbed by a busy machine, and is flagged rather than shown as fact."""
    one = perf.decode_tps_1
    for p in perf.aggregate_tps:
        if one > 0 and p.x > 1 and p.y > BATCH_SLACK * p.x * one:
            return (f"{p.y:.1f} tok/s at {p.x:g} requests is {p.y / one:.0f}x the {one:.1f} tok/s of one request, "
                    f"more than {p.x:g} requests can give: the layers were probably timed on a busy machine. "
                    "Preview again when it is quieter; until then these figures are not to be trusted")
    return ""


def performance_view(perf: Performance | None) -> dict[str, Any] | None:
    """The plan's predicted performance (planner/predict.Performance) in words and numbers."""
    if perf is None:
        return None
    agg = [{"requests": p.x, "tps": f"{p.y:.1f}"} for p in perf.aggregate_tps]
    ttft = [{"prompt": f"{p.x // 1024}k" if p.x % 1024 == 0 else str(p.x), "seconds": seconds_text(p.y)}
            for p in perf.ttft_s]
    return {"decode_1": f"{perf.decode_tps_1:.1f}", "ms_per_token": f"{perf.ms_per_token_1:.1f}",
            "compute_ms": f"{perf.compute_ms_1:.1f}", "aggregate": agg, "ttft": ttft,
            "inconsistent": inconsistency(perf),
            # the verdict at every context: without one, no selected node could hold the model alone
            "bottleneck": perf.bottleneck, "single_node": perf.single_node
            or "no selected node could hold the whole model alone at this context and concurrency: the split is the "
               "way to serve it",
            "automatic": perf.automatic, "note": perf.timing_note,
            "speculation": [{"workload": g.workload, "gain": f"{g.gain:.2f}", "tps": f"{g.decode_tps:.1f}",
                             "per_pass": f"{g.tokens_per_pass:.2f}", "loses": g.gain < 1} for g in perf.speculation],
            "boundaries": [{"source": b.source, "target": b.target, "link": b.link, "interface": b.interface,
                            "measured": b.measured, "ms": f"{b.ms_per_token:.2f}"} for b in perf.boundaries]}
