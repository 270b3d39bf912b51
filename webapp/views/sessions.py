"""Sessions: one row per serving session; a cluster is one row with a Cluster badge (pure)."""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from orchestrator.control.rules.state import Fault, Session, Speculation, StageCache, StageProgress, State
from webapp.views.charts import step_chart, throughput_chart
from webapp.views.context import ViewContext
from webapp.views.format import size


def stage_rows(s: Session) -> list[dict[str, Any]]:
    """Per-stage breakdown shared by the live monitor and the Cluster stages tab."""
    rows = []
    ended = s.phase in ("stopped", "failed")  # what was last seen is history: the processes are gone
    steps = {t.key: t.state for t in s.timeline}
    for st in s.stages:
        status = s.stage_status[st.index] if st.index < len(s.stage_status) else None
        # during the launch, before the watcher's first look: what the launch saw (started, listening)
        launching = s.phase == "launching"
        started = launching and steps.get(f"stage-{st.index}.start") == "done"
        listened = launching and steps.get(f"stage-{st.index}.listen") == "done"
        alive = status.alive if status is not None and status.alive is not None else (True if started else None)
        listening = status.port_listening if status is not None and status.port_listening is not None \
            else (True if listened else None)
        rows.append({
            "index": st.index, "node": st.node_name, "layers": f"{st.first_layer}–{st.last_layer}",
            "port": st.port,
            "alive": alive,
            "listening": listening,
            "step_ms": None if status is None or status.step_ms is None or ended else round(status.step_ms, 2),
            "detail": "" if status is None else (status.fault or status.detail),
            "progress": None if status is None or ended else progress_text(status.progress),
            "prompt_cache": None if status is None or ended else cache_text(status.prompt_cache),
            "speculation": None if status is None or ended else speculation_text(status.speculation),
            "chart": step_chart(s, st.index), "ended": ended,
        })
    return rows


def cache_text(c: StageCache | None) -> str | None:
    """A stage card's prompt-cache line: entries, bytes, hits, tokens not prefilled again."""
    if c is None:
        return None
    return (f"{c.entries} entr{'y' if c.entries == 1 else 'ies'} · {size(c.bytes)} · {c.hits} hit"
            f"{'' if c.hits == 1 else 's'} · {c.tokens_reused:,} tokens reused")


def speculation_text(s: Speculation | None) -> str | None:
    """The last stage's card: how its verification passes went (accepted drafts, tokens per pass)."""
    if s is None:
        return None
    if s.refused:
        why = f" ({s.refusal})" if s.refusal else ""
        return f"on, but this model cannot verify drafts exactly{why}: it never drafts (docs/speculation.md)"
    if not s.passes:
        return f"on (up to {s.max_drafts} drafts per pass), no pass verified yet"
    return (f"{s.accepted / max(1, s.drafted):.0%} of {s.drafted:,} drafts accepted · "
            f"{(s.accepted + s.passes) / s.passes:.2f} tokens per pass · {s.passes:,} passes")


def shown_health(s: Session) -> str:
    """The health badge's word: "Healthy" only with the facts that make it so.

    The launch marks a session Healthy when its last step is done, a moment before the watcher
    has looked at its processes; until every stage is seen alive and listening the badge says
    "Checking" (the stage cards would still say "not seen yet" beside a Healthy badge).
    """
    if s.phase == "stopping":  # a stop keeps the last health, but it no longer serves
        return "Stopping"
    if s.health != "Healthy":
        return s.health
    seen = [s.stage_status[st.index] if st.index < len(s.stage_status) else None for st in s.stages]
    return "Healthy" if all(x is not None and x.alive and x.port_listening for x in seen) else "Checking"


def session_state(s: Session) -> str:
    """What a session does on its nodes, in one word: "Serving" only once healthy with its facts."""
    if s.phase == "running":
        health = shown_health(s)
        return "Serving" if health == "Healthy" else health
    return {"launching": "Starting"}.get(s.phase, s.phase.capitalize())


def progress_text(p: StageProgress | None) -> str | None:
    """A stage's progress in words: steps done, and what it computes now (pure)."""
    if p is None:
        return None
    text = f"{p.steps:,} steps"
    if p.busy_s > 0 and p.chunk:
        what = "decoding" if p.chunk[1] == 1 else f"prefill of {p.chunk[1]} tokens at {p.chunk[0]}"
        text += f" · {what} for {p.busy_s:.1f} s"
    else:
        text += " · idle"
    return text + (f" · {p.queued} queued" if p.queued else "")


def fault_rows(s: Session) -> list[dict[str, Any]]:
    """The session's faults, newest first, with what was left of each replaced process (pure)."""
    return [_fault_row(f, s.cluster) for f in reversed(s.faults)]


def _fault_row(f: Fault, cluster: bool = True) -> dict[str, Any]:
    # a single-node session is no "cluster" (issue 38 item 5)
    outcome = {"recovered": f"recovered in {f.recovery_s:.1f} s" if f.recovery_s is not None else "recovered",
               "stopped": "cluster stopped" if cluster else "session stopped", "recovering": "recovering"}[f.outcome]
    return {"at": time.strftime("%H:%M:%S", time.localtime(f.at)) if f.at else "", "reason": f.reason,
            "outcome": outcome, "state": f.outcome, "attempts": f.attempts,
            "processes": ", ".join(f.processes) or "–", "resumed": resumed_text(f),
            "post_mortems": [{"process": m.process, "node": m.node_name, "ended": m.ended,
                              "progress": progress_text(m.progress), "log": "\n".join(m.log_tail)}
                             for m in f.post_mortems]}


def resumed_text(f: Fault) -> str:
    """What became of the answers in flight during a fault's recovery, as its Faults line says it
    ("3 requests resumed, 0 lost in 12.3 s"); "" when nothing was held or it is not known yet (pure)."""
    r = f.resumed
    if r is None:
        return ""
    text = f"{r.resumed} {'request' if r.resumed == 1 else 'requests'} resumed, {r.lost} lost"
    return text + (f" in {r.seconds:.1f} s" if r.seconds is not None else "")


def session_row(s: Session) -> dict[str, Any]:
    """One Sessions row."""
    return {"id": s.id, "name": s.name, "model": s.model_name, "cluster": s.cluster, "health": shown_health(s),
            "phase": s.phase, "reason": s.reason, "url": s.url, "stages": stage_rows(s),
            "throughput": throughput_chart(s), "config": s.config_toml, "faults": fault_rows(s),
            "nodes": ", ".join(dict.fromkeys(st.node_name for st in s.stages))}


def chat_models_view(state: State, ctx: ViewContext) -> dict[str, Any]:
    """A digest of the sessions the router may serve (name, phase, registration, health): when it
    changes, the Chat page asks the router for its models again."""
    facts = sorted((s.model_name, s.phase, s.registered, s.health) for s in state.sessions)
    return {"digest": hashlib.sha256(json.dumps(facts).encode()).hexdigest()[:16]}


def sessions_view(state: State, ctx: ViewContext) -> dict[str, Any]:
    """Live sessions (launching, running, stopping)."""
    return {"sessions": [session_row(s) for s in state.sessions]}
