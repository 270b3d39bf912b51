"""`decide` and `react` as tables: every rule of the control plane, with no process, thread
or clock — a state and a command in, events and effects (or a refusal) out."""

from __future__ import annotations

import pytest

from orchestrator.control.rules import events as ev
from orchestrator.control.rules.commands import (
    AddNode,
    CommandRefused,
    LaunchCluster,
    LaunchSession,
    LaunchSingle,
    PrepareModel,
    PreviewPlan,
    RemoveNode,
    ResumeSession,
    StopSession,
    UpdateSettings,
)
from orchestrator.control.rules.decide import (
    CancelWork,
    MeasureAfterPreview,
    Readopt,
    RunPreparation,
    StartLaunch,
    StartRecovery,
    StartTeardown,
    decide,
    react,
)
from orchestrator.control.rules.state import (
    Settings,
    State,
)
from orchestrator.control.rules.transitions import apply
from orchestrator.planner import Plan, Refusal
from tests.support.builders import GIB, node, session
from tests.support.control_states import (
    BASE,
    FAULT,
    HELD,
    MODEL,
    PREPARED,
    SERVING,
    SHOWN,
    effect_types,
    kinds,
    prepared,
    with_session,
)

# --- refusals: nothing happens, the message says why ----------------------------------------
REFUSED = [
    ("port range upside down", BASE, UpdateSettings(Settings(port_start=39700, port_end=39600)), "must not exceed"),
    ("remove an unknown node", BASE, RemoveNode("nobody"), "no registered node"),
    ("remove a serving node", SERVING, RemoveNode("n1"), "serves smol-2stage: stop it first"),
    ("prepare while preparing", BASE.model_copy(update={"preparation": prepared(False)}),
     PrepareModel(MODEL, ("n0",)), "already preparing smol"),
    ("prepare on an unknown node", BASE, PrepareModel(MODEL, ("n0", "n9")), "unknown nodes: n9"),
    ("prepare on no node", BASE, PrepareModel(MODEL, ()), "select at least one node"),
    ("preview an unknown model", BASE, PreviewPlan("other", ("n0", "n1")), "no registered node has a model"),
    ("preview on an unknown node", BASE, PreviewPlan(MODEL, ("n0", "n9")), "not registered"),
    ("launch unprepared", BASE, LaunchCluster(MODEL, ("n0", "n1"), "s2", 5.0), "prepare the model"),
    ("launch on nodes not prepared", PREPARED.model_copy(update={"nodes": (*BASE.nodes, BASE.nodes[1].model_copy(
        update={"id": "n2"}))}), LaunchCluster(MODEL, ("n0", "n2"), "s2", 5.0), "prepare the model"),
    ("launch still preparing", BASE.model_copy(update={"preparation": prepared(False)}),
     LaunchCluster(MODEL, ("n0", "n1"), "s2", 5.0), "prepare the model"),
    ("single on an unknown node", BASE, LaunchSingle(MODEL, "n9", "s2", 5.0), "not registered"),
    ("single of an unknown model", BASE, LaunchSingle("other", "n0", "s2", 5.0), "no registered node has"),
    ("session on an unregistered node", BASE.model_copy(update={"nodes": BASE.nodes[:1]}),
     LaunchSession(session("s2"), MODEL, 5.0), "'n1' is not registered"),
    ("session name already live", SERVING, LaunchSession(session("s2"), MODEL, 5.0), "already live"),
    ("launch what the nodes already serve", SERVING, LaunchCluster(MODEL, ("n1", "n0"), "s2", 5.0),
     "node-a and node-b already serve smol as smol-2stage: stop that cluster first"),
    ("stop an unknown session", BASE, StopSession("nobody"), "no live session"),
    ("stop an ended session", BASE.model_copy(update={"history": (session(phase="stopped"),)}), StopSession("s1"),
     "no live session"),
    ("stop a stopping session", with_session(BASE, phase="stopping"), StopSession("s1"), "no live session"),
]


@pytest.mark.parametrize("state, command, message", [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_a_refused_command_changes_nothing_and_says_why(state, command, message):
    with pytest.raises(CommandRefused, match=message):
        decide(state, command)


# --- accepted commands: their events and effects ----------------------------------------------
ACCEPTED = [
    ("settings", BASE, UpdateSettings(Settings(auto_restart=False)), ["settings_changed"], []),
    ("add a node", BASE, AddNode(BASE.nodes[1].model_copy(update={"id": "n7"})), ["node_registered"], []),
    ("remove an idle node", SERVING.model_copy(update={"sessions": ()}), RemoveNode("n1"), ["node_removed"], []),
    ("prepare", BASE, PrepareModel(MODEL, ("n0", "n1")), [], ["RunPreparation"]),
    ("prepare again once finished", PREPARED, PrepareModel(MODEL, ("n0",)), [], ["RunPreparation"]),
    ("preview and measure", BASE, PreviewPlan(MODEL, ("n0", "n1")), ["plan_previewed"], ["MeasureAfterPreview"]),
    ("preview only", BASE, PreviewPlan(MODEL, ("n0", "n1"), measure=False), ["plan_previewed"], []),
    ("preview again while it is shown", SHOWN, PreviewPlan(MODEL, ("n1", "n0"), measure=False, only_if_shown=True),
     ["plan_previewed"], []),
    ("no preview again once another is shown", SHOWN, PreviewPlan(MODEL, ("n0",), measure=False, only_if_shown=True),
     [], []),
    ("no preview again when none is shown", BASE, PreviewPlan(MODEL, ("n0",), measure=False, only_if_shown=True),
     [], []),
    ("no preview again once the same nodes are shown at another context length", SHOWN,
     PreviewPlan(MODEL, ("n0", "n1"), context_length=2048, measure=False, only_if_shown=True), [], []),
    ("launch a cluster", PREPARED, LaunchCluster(MODEL, ("n0", "n1"), "s2", 5.0),
     ["plan_previewed", "session_created"], ["StartLaunch"]),
    ("launch on one node", BASE, LaunchSingle(MODEL, "n0", "s2", 5.0), ["session_created"], ["StartLaunch"]),
    ("launch placed stages", BASE, LaunchSession(session("s2"), MODEL, 5.0), ["session_created"], ["StartLaunch"]),
    ("stop a launch", with_session(BASE, phase="launching"), StopSession("s1"), [], ["CancelWork"]),
    ("stop a running session", SERVING, StopSession("s1"), ["health_changed"], ["StartTeardown"]),
    ("stop a recovering session", with_session(BASE, phase="recovering"), StopSession("s1"), ["health_changed"],
     ["CancelWork", "StartTeardown"]),
    ("resume a recovery", with_session(BASE, phase="recovering", faults=(FAULT,), recovery_attempt=1),
     ResumeSession("s1", "recovering", "", (), 9.0), [], ["StartRecovery"]),
    ("repair a culprit seen after a restart", SERVING, ResumeSession("s1", "running", "stage-1 exited", ("stage-1",),
                                                                     9.0), ["session_faulted"], []),
    ("re-adopt a serving session", SERVING, ResumeSession("s1", "running", "", (), 9.0), [], ["Readopt"]),
    ("relaunch a session whose every stage ended while the dashboard was away", SERVING,
     ResumeSession("s1", "running", "stage-0 ended", ("coordinator",), 9.0, gone=("stage-0", "stage-1")),
     ["session_faulted"], []),
    ("repair only what is gone while a stage still runs", SERVING,
     ResumeSession("s1", "running", "stage-1 ended", ("stage-1",), 9.0, gone=("stage-1",)), ["session_faulted"], []),
    ("clean up a session found gone with restarts off", SERVING.model_copy(update={"settings": Settings(
        auto_restart=False)}), ResumeSession("s1", "running", "stage-0 ended", ("stage-0", "stage-1"), 9.0,
                                             gone=("stage-0", "stage-1", "coordinator")),
     ["health_changed"], ["StartTeardown"]),
    ("clean up without a culprit", SERVING, ResumeSession("s1", "running", "coordinator odd", (), 9.0),
     ["health_changed"], ["StartTeardown"]),
    ("clean up with restarts off", SERVING.model_copy(update={"settings": Settings(auto_restart=False)}),
     ResumeSession("s1", "running", "stage-1 exited", ("stage-1",), 9.0), ["health_changed"], ["StartTeardown"]),
    ("clean up a launch cut short", with_session(BASE, phase="launching"),
     ResumeSession("s1", "launching", "", (), 9.0), ["health_changed"], ["StartTeardown"]),
    ("leave a session that moved on", with_session(BASE, phase="recovering"),
     ResumeSession("s1", "running", "stage-1 exited", ("stage-1",), 9.0), [], []),
    ("leave a session that ended", BASE, ResumeSession("s1", "running", "", (), 9.0), [], []),
]


@pytest.mark.parametrize("state, command, events, effects", [r[1:] for r in ACCEPTED], ids=[r[0] for r in ACCEPTED])
def test_an_accepted_command_gives_its_events_and_effects(state, command, events, effects):
    decision = decide(state, command)
    assert (kinds(decision), effect_types(decision), decision.refusal) == (events, effects, "")
    assert decide(state, command) == decision  # pure: the same state and command, the same answer
    after = state
    for event in decision.events:
        after = apply(after, event)
    assert after.version == state.version + len(events)  # every event it returns changes the state


def test_a_preview_shows_what_was_asked_and_the_typed_answer():
    decision = decide(BASE, PreviewPlan(MODEL, ("n1", "n0"), context_length=2048, concurrency=2))
    shown = decision.events[0].plan
    assert (shown.model_id, shown.node_ids, shown.context_length) == (MODEL, ("n1", "n0"), 2048)
    assert isinstance(shown.result, Plan) and shown.result.settings.max_concurrent_sequences == 2
    assert decision.effects == (MeasureAfterPreview(MODEL, ("n1", "n0"), 2048, 2, None, True, True),)
    assert apply(BASE, decision.events[0]).plan == shown


def test_a_launch_the_planner_refuses_shows_the_refusal_then_is_refused():
    tight = PREPARED.model_copy(update={"nodes": (node("node-a", 300 << 20, models=HELD),
                                                  node("node-b", 300 << 20, models=HELD))})
    decision = decide(tight, LaunchCluster(MODEL, ("n0", "n1"), "s2", 5.0))
    assert kinds(decision) == ["plan_previewed"] and decision.effects == ()
    assert isinstance(decision.events[0].plan.result, Refusal)
    assert decision.refusal and decision.refusal == "; ".join(r.message for r in decision.events[0].plan.result.reasons)


def test_a_launch_whose_name_is_live_keeps_the_preview_and_is_refused():
    other = session("s9", name="smol-2stage").model_copy(update={"model_id": "other"})  # the name, not the model
    busy = PREPARED.model_copy(update={"sessions": (other,)})
    decision = decide(busy, LaunchCluster(MODEL, ("n0", "n1"), "s2", 5.0))
    assert kinds(decision) == ["plan_previewed"] and "already live" in decision.refusal


def test_a_launched_session_has_its_id_time_and_pending_timeline():
    decision = decide(PREPARED, LaunchCluster(MODEL, ("n0", "n1"), "s2", 5.0, context_length=2048))
    created = decision.events[1].session
    assert (created.id, created.created_at, created.name, created.phase) == ("s2", 5.0, "smol-2stage", "launching")
    assert created.config_toml and [s.node_id for s in created.stages] == ["n0", "n1"]
    assert created.timeline and {st.state for st in created.timeline if st.key != "transport"} == {"pending"}
    assert decision.effects == (StartLaunch(created, MODEL),)


def test_a_single_node_session_runs_every_layer_on_its_node():
    created = decide(BASE, LaunchSingle(MODEL, "n1", "s2", 5.0)).events[0].session
    assert not created.cluster and created.node_ids == ("n1",)
    assert (created.stages[0].first_layer, created.stages[0].last_layer) == (0, 29)


def test_a_single_node_session_is_bounded_to_what_its_memory_check_counted():
    import tomllib

    created = decide(BASE, LaunchSingle(MODEL, "n1", "s2", 5.0, context_length=2048, concurrency=2)).events[0].session
    table = tomllib.loads(created.config_toml)["cluster"]
    assert (table["context_length"], table["max_requests"], table["pipeline_parallel_size"]) == (2048, 2, 1)


@pytest.mark.parametrize("free, context, concurrency, refused", [
    (8 * GIB, 4096, 4, False),
    (GIB // 2, 4096, 4, True),  # SmolLM2's 0.5 GiB of weights plus its KV cache and overhead: too much
    (GIB // 2, 256, 1, True),
    (int(1.5 * GIB), 8192, 64, True),  # the KV cache of 64 x 8k tokens
    (int(1.5 * GIB), 4096, 4, False),
])
def test_a_single_node_session_that_does_not_fit_is_refused_with_the_numbers(free, context, concurrency, refused):
    st = BASE.model_copy(update={"nodes": (node("node-a", free, models=HELD), BASE.nodes[1])})
    command = LaunchSingle(MODEL, "n0", "s2", 5.0, context_length=context, concurrency=concurrency)
    if not refused:
        assert decide(st, command).events[0].kind == "session_created"
        return
    with pytest.raises(CommandRefused) as refusal:
        decide(st, command)
    why = str(refusal.value)
    assert why.startswith(f"model {MODEL} needs ") and "on node node-a" in why and "missing" in why, why
    assert "KV cache" in why and f"for {concurrency} x {context} tokens" in why, why


def test_a_stop_tears_down_what_ran_with_its_reason():
    decision = decide(SERVING, StopSession("s1"))
    assert decision.events == (ev.HealthChanged(session_id="s1", health="Starting", phase="stopping",
                                                reason="stop requested"),)
    assert decision.effects == (StartTeardown(session(), "Stopped", "stopped by request"),)
    assert decide(with_session(BASE, phase="launching"), StopSession("s1")).effects == (CancelWork("s1"),)


def test_a_fault_seen_after_a_restart_is_reported_as_such():
    decision = decide(SERVING, ResumeSession("s1", "running", "stage-1 exited", ("stage-1",), 9.0))
    assert decision.events == (ev.SessionFaulted(session_id="s1", reason="seen after a dashboard restart: "
                                                 "stage-1 exited", processes=("stage-1",), at=9.0),)
    cleanup = decide(SERVING, ResumeSession("s1", "running", "router registration failed: down", (), 9.0))
    assert cleanup.effects == (StartTeardown(session(), "Unhealthy", "cleaned up after a dashboard restart: "
                                             "router registration failed: down"),)
    assert decide(SERVING, ResumeSession("s1", "running", "", (), 9.0)).effects == (Readopt(session()),)
    prep = decide(BASE, PrepareModel(MODEL, ("n0",)))
    assert prep.effects == (RunPreparation(MODEL, ("n0",), None),)


def test_a_session_whose_stages_all_ended_during_a_restart_is_relaunched_whole_in_launch_order():
    """Issue 38 item 1: the restarted dashboard once saw the stages alive (their leases about to
    lapse) and replaced the coordinator alone, which waited for stages that no longer existed.
    Every stage gone: every process starts again, stages first, under the same plan, and the
    timeline says it is a relaunch after the restart."""
    command = ResumeSession("s1", "running", "stage-0 ended (lease expired)", ("stage-0", "coordinator"), 9.0,
                            gone=("stage-1", "stage-0"))
    [fault] = decide(SERVING, command).events
    assert fault.processes == ("stage-0", "stage-1", "coordinator") and fault.relaunch, fault
    assert "relaunched after a dashboard restart" in fault.reason and "lease expired" in fault.reason
    after = apply(SERVING, fault)
    s = after.session("s1")
    assert s.phase == "recovering" and "the same plan" in s.reason and s.faults[-1].relaunch
    steps = [st for st in s.timeline if st.key.startswith("recovery-1.1.")]
    assert all(st.label.startswith("Relaunch after the dashboard's restart: ") for st in steps), steps
    assert [st.key.removeprefix("recovery-1.1.") for st in steps] == [
        "stage-0.stop", "stage-1.stop", "coordinator.stop", "stage-0.start", "stage-0.listen", "stage-1.start",
        "stage-1.listen", "coordinator.start", "coordinator.healthy", "router.register"]
    assert _react(SERVING, fault) == (StartRecovery(s),)
    done = apply(after, ev.SessionRecovered(session_id="s1", seconds=4.0)).session("s1")
    assert done.health == "Healthy" and done.reason.startswith("relaunched after a dashboard restart")


# --- react: what follows from an applied event ------------------------------------------------
def _react(state: State, event: ev.Event):
    return react(state, apply(state, event), event)


RUNNING = with_session(BASE, health="Healthy")
RECOVERING = with_session(BASE, phase="recovering", faults=(FAULT,), recovery_attempt=1)
REACTIONS = [
    ("a fault with a culprit: recover", RUNNING,
     ev.SessionFaulted(session_id="s1", reason="gone", processes=("stage-1",)), ["StartRecovery"]),
    ("a fault without a culprit: tear down", RUNNING, ev.SessionFaulted(session_id="s1", reason="odd"),
     ["StartTeardown"]),
    ("a fault with restarts off: tear down", RUNNING.model_copy(update={"settings": Settings(auto_restart=False)}),
     ev.SessionFaulted(session_id="s1", reason="gone", processes=("stage-1",)), ["StartTeardown"]),
    ("a second fault while recovering: nothing", RECOVERING,
     ev.SessionFaulted(session_id="s1", reason="again", processes=("stage-0",)), []),
    ("a failed attempt: the next one", RECOVERING, ev.RecoveryFailed(session_id="s1", reason="no"),
     ["StartRecovery"]),
    ("a final failure: tear down", RECOVERING, ev.RecoveryFailed(session_id="s1", reason="no", final=True),
     ["StartTeardown"]),
    ("the last attempt failed: tear down", RECOVERING.model_copy(update={"sessions": (session(
        phase="recovering", faults=(FAULT,), recovery_attempt=3),)}), ev.RecoveryFailed(session_id="s1", reason="no"),
     ["StartTeardown"]),
    ("a fault of an unknown session: nothing", BASE, ev.SessionFaulted(session_id="s9", reason="x"), []),
    ("recovered: nothing more", RECOVERING, ev.SessionRecovered(session_id="s1", seconds=1.0), []),
    ("a stop's health change: nothing more (the stop tore down)", RUNNING,
     ev.HealthChanged(session_id="s1", health="Healthy", phase="stopping"), []),
]


@pytest.mark.parametrize("state, event, effects", [r[1:] for r in REACTIONS], ids=[r[0] for r in REACTIONS])
def test_what_follows_from_an_event(state, event, effects):
    assert [type(e).__name__ for e in _react(state, event)] == effects


def test_a_teardown_after_a_fault_carries_the_sessions_reason():
    (effect,) = _react(RUNNING, ev.SessionFaulted(session_id="s1", reason="odd"))
    assert isinstance(effect, StartTeardown) and effect.health == "Unhealthy"
    assert effect.reason == "odd (no single process to replace)" and effect.session.phase == "stopping"
    (again,) = _react(RECOVERING, ev.RecoveryFailed(session_id="s1", reason="no"))
    assert isinstance(again, StartRecovery) and again.session.recovery_attempt == 2
