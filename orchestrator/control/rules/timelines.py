"""The timeline steps of launches and recoveries, and how events change them (pure).

A session's timeline is what the dashboard shows of its launch and of every recovery
attempt: one `Step` per thing that happens, pending until a worker reports it. These
builders are pure functions of the session (and an event), used by `decide` (a launch's
steps), `transitions` (a recovery attempt's steps, a stage moved, a copy started) and the
I/O workers that report the steps by key (`launcher`, `recovery`, `stage_copy`). Nothing here
does I/O or imports a module that does (tests/control/test_purity.py).
"""

from __future__ import annotations

from orchestrator.control.rules import events as ev
from orchestrator.control.rules.state import ResumedRequests, Session, Step
from orchestrator.units import format_bytes, format_rate

BACKOFF_S = (0.0, 1.0, 2.0, 4.0, 8.0)  # before attempt 1, 2, 3, ...; covers an agent restarting
# Bounded by the slowest LAN the copy should still finish over (10 MB/s), plus a floor for
# the start and the final check: a copy that takes longer fails the attempt instead of
# holding the session in recovery for ever.
COPY_FLOOR_S = 600.0
SLOWEST_BPS = 10e6


def timeline(session: Session) -> tuple[Step, ...]:
    """The launch steps of a session, all pending (pure)."""
    steps: list[Step] = []
    if session.transport:
        # decided by the plan before anything starts: what the stages bind on, and why a
        # requested backend does not run (e.g. rdma → tcp)
        steps.append(Step(key="transport", label=session.transport, state="done", detail=session.transport_fallback))
    for st in session.stages:
        steps.append(Step(key=f"stage-{st.index}.start", label=f"Stage {st.index} starting on {st.node_name} "
                                                               f"(layers {st.first_layer}–{st.last_layer})"))
        steps.append(Step(key=f"stage-{st.index}.listen",
                          label=f"Stage {st.index} transport listening on port {st.port}"))
    steps.append(Step(key="coordinator.start", label="Coordinator starting"))
    steps.append(Step(key="coordinator.healthy", label="Coordinator healthy (a probe generation through every stage)"))
    steps.append(Step(key="router.register", label="Router registered and routing to it (its probe answered)"))
    return tuple(steps)


def backoff(attempt: int) -> float:
    """Seconds to wait before recovery attempt `attempt` (1-based)."""
    return BACKOFF_S[min(attempt - 1, len(BACKOFF_S) - 1)]


def process_label(process: str) -> str:
    """'Coordinator', or 'Stage N' for stage-N."""
    return "Coordinator" if process == "coordinator" else f"Stage {process.split('-', 1)[1]}"


def step_prefix(fault_number: int, attempt: int) -> str:
    """Timeline keys of one recovery attempt start with this (unique per fault and attempt)."""
    return f"recovery-{fault_number}.{attempt}."


def attempt_head(fault_number: int, attempt: int, relaunch: bool = False) -> str:
    """The label prefix of one recovery attempt's steps (a relaunch after a restart says so)."""
    what = "Relaunch after the dashboard's restart" if relaunch else f"Recovery {fault_number}"
    return what + (f", attempt {attempt}" if attempt > 1 else "") + ": "


def recovery_steps(session: Session, processes: tuple[str, ...], fault_number: int, attempt: int,
                   relaunch: bool = False) -> tuple[Step, ...]:
    """The pending timeline steps of one recovery attempt (pure); a relaunch (every stage found
    gone after a restart) starts every process again in the launch's order and says so."""
    if relaunch:
        return relaunch_steps(session, processes, fault_number, attempt)
    p = step_prefix(fault_number, attempt)
    head = attempt_head(fault_number, attempt)
    nodes = {f"stage-{st.index}": (st.node_name, st.port) for st in session.stages}
    coordinator_node = next((st.node_name for st in session.stages if st.node_id == session.coordinator_node),
                            "its node")
    steps = []
    for proc in processes:
        node, port = nodes.get(proc, (coordinator_node, session.coordinator_port))
        steps.append(Step(key=p + f"{proc}.stop",
                          label=head + f"{process_label(proc)} stopped on {node} (post-mortem kept)"))
        steps.append(Step(key=p + f"{proc}.start", label=head + f"{process_label(proc)} restarting on {node}"))
        if proc != "coordinator":
            steps.append(Step(key=p + f"{proc}.listen",
                              label=head + f"{process_label(proc)} transport listening on port {port}"))
    steps.append(Step(key=p + "coordinator.healthy",
                      label=head + "coordinator healthy again (re-connected, probe through every stage)"))
    steps.append(Step(key=p + "router.register", label=head + "router routes to it again (the entry stayed "
                                                               "registered; the router answered 503 + Retry-After "
                                                               "meanwhile)"))
    return tuple(steps)


def resumed_step(fault_number: int, r: ResumedRequests) -> Step:
    """The step that ends recovery `fault_number`: what became of the answers in flight the coordinator
    held meanwhile ("Recovery 1: 3 requests resumed, 0 lost"), with how long the pause lasted (pure)."""
    requests = "request" if r.resumed == 1 else "requests"
    times = []
    if r.seconds is not None:
        times.append(f"{r.seconds:.1f} s from the stage's loss until every held answer went on or ended")
    if r.ready_s is not None:
        times.append(f"the pipeline ready again after {r.ready_s:.1f} s")
    held = f"{r.held} held" + (f"; {'; '.join(times)}" if times else "")
    return Step(key=f"recovery-{fault_number}.resumed", label=f"Recovery {fault_number}: {r.resumed} {requests} "
                                                              f"resumed, {r.lost} lost",
                state="done" if not r.lost else "failed", detail=held)


def relaunch_steps(session: Session, processes: tuple[str, ...], fault_number: int,
                   attempt: int) -> tuple[Step, ...]:
    """The steps of a relaunch: what was found gone (post-mortems kept), then the launch's own
    steps in its order — stages ascending, the coordinator, the router — under the same plan."""
    p = step_prefix(fault_number, attempt)
    head = attempt_head(fault_number, attempt, relaunch=True)
    nodes = {f"stage-{st.index}": st.node_name for st in session.stages}
    coordinator_node = next((st.node_name for st in session.stages if st.node_id == session.coordinator_node),
                            "its node")
    steps = [Step(key=p + f"{proc}.stop", label=head + f"{process_label(proc)} on "
                                                      f"{nodes.get(proc, coordinator_node)}: what was left stopped "
                                                      "(post-mortem kept)") for proc in processes]
    for st in session.stages:
        if f"stage-{st.index}" in processes:
            steps.append(Step(key=p + f"stage-{st.index}.start",
                              label=head + f"Stage {st.index} started again on {st.node_name} "
                                           f"(layers {st.first_layer}–{st.last_layer}, the same plan)"))
            steps.append(Step(key=p + f"stage-{st.index}.listen",
                              label=head + f"Stage {st.index} transport listening on port {st.port}"))
    if "coordinator" in processes:
        steps.append(Step(key=p + "coordinator.start", label=head + f"Coordinator started again on {coordinator_node}"))
    steps.append(Step(key=p + "coordinator.healthy",
                      label=head + "coordinator healthy (a probe generation through every stage)"))
    steps.append(Step(key=p + "router.register", label=head + "router routes to it again"))
    return tuple(steps)


def stage_moved(session: Session, e: ev.StageMoved) -> Session:
    """The session after its stage `e.stage.index` moved to another node during the current
    recovery attempt: its placement and TOML, and the attempt's steps for it (pure)."""
    k, new = e.stage.index, e.stage
    if not 0 <= k < len(session.stages):
        return session
    old = session.stages[k]
    p = step_prefix(len(session.faults), session.recovery_attempt) + f"stage-{k}."
    head = attempt_head(len(session.faults), session.recovery_attempt)
    # The move step follows the model's copy to the node when there was one, else the stop.
    after = p + "copy" if any(st.key == p + "copy" for st in session.timeline) else p + "stop"
    steps: list[Step] = []
    for st in session.timeline:
        if st.key == p + "start":
            st = st.model_copy(update={"label": head + f"Stage {k} starting on {new.node_name} "
                                                       f"(layers {new.first_layer}–{new.last_layer})"})
        elif st.key == p + "listen":
            st = st.model_copy(update={"label": head + f"Stage {k} transport listening on port {new.port}"})
        steps.append(st)
        if st.key == after:
            steps.append(Step(key=p + "move", label=head + f"stage {k} moved to {new.node_name} "
                                                           f"(from {old.node_name})", state="done", detail=e.reason))
        elif st.key == p + "listen":
            steps.append(Step(key=p + "route", label=head + f"coordinator told stage {k}'s new address "
                                                            f"({new.host}:{new.port}); it passes it down the chain"))
    stages = tuple(new if st.index == k else st for st in session.stages)
    return session.model_copy(update={"stages": stages, "config_toml": e.config_toml, "timeline": tuple(steps)})


def ordered(processes: tuple[str, ...]) -> tuple[str, ...]:
    """Stages in ascending order, the coordinator last (it connects to them)."""
    stages = sorted((p for p in processes if p != "coordinator"), key=lambda p: int(p.split("-", 1)[1]))
    return tuple(stages) + (("coordinator",) if "coordinator" in processes else ())


def copy_timeout(total_bytes: int) -> float:
    """Seconds a copy of `total_bytes` may take before the attempt gives up on it."""
    return COPY_FLOOR_S + total_bytes / SLOWEST_BPS


def progress_detail(done: int, total: int, rate_bps: float = 0.0) -> str:
    """A copy's progress as the timeline shows it: bytes, per cent and rate (pure)."""
    percent = 100 * done // total if total > 0 else 0
    rate = f", {format_rate(rate_bps)}" if rate_bps > 0 else ""
    return f"{format_bytes(done)} of {format_bytes(total)} ({percent} %){rate}"


def copy_key(index: int) -> str:
    """The copy step's key within a recovery attempt (after the attempt's prefix)."""
    return f"stage-{index}.copy"


def copy_started(session: Session, e: ev.StageCopyStarted) -> Session:
    """The session with the copy's step in its current recovery attempt, right after the
    stage's stop step (pure)."""
    p = step_prefix(len(session.faults), session.recovery_attempt)
    key = p + copy_key(e.index)
    if not any(st.key == p + f"stage-{e.index}.stop" for st in session.timeline) or \
            any(st.key == key for st in session.timeline):
        return session
    head = attempt_head(len(session.faults), session.recovery_attempt)
    step = Step(key=key, state="running", detail=progress_detail(0, e.total_bytes),
                label=head + f"{e.model_id} copied to {e.node_name} over the LAN from {', '.join(e.sources)} "
                             "(no node holding it had room; every file verified)")
    steps: list[Step] = []
    for st in session.timeline:
        steps.append(st)
        if st.key == p + f"stage-{e.index}.stop":
            steps.append(step)
    return session.model_copy(update={"timeline": tuple(steps)})
