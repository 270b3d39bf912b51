"""View models (pure): memory-fit bars, the launch summary, the form's current choice."""

from __future__ import annotations

from tests.support.view_states import cluster, failed_cluster, plan, rich_state
from webapp.components import COMPONENTS
from webapp.touches import LIVE_COMPONENTS
from webapp.views.cluster import form_view, launch_summary, monitor_view, prepare_view
from webapp.views.context import ViewContext
from webapp.views.plan import fit_bar, plan_view

MB = 1 << 20  # MiB: the dashboard shows binary units (orchestrator.units)
CTX = ViewContext(role="viewer")


def test_a_fitting_stage_shows_its_parts_against_free_memory_and_the_headroom():
    b = fit_bar(400 * MB, 100 * MB, 100 * MB, 800 * MB)
    assert b["fits"] and [s["percent"] for s in b["segments"]] == [50.0, 12.5, 12.5]
    assert b["headroom"] == "200 MiB" and b["used_percent"] == 75 and b["short"] is None
    assert [s["label"] for s in b["segments"]] == ["weights", "KV cache", "overhead"]


def test_a_stage_that_does_not_fit_spans_its_need_and_marks_where_free_memory_ends():
    b = fit_bar(600 * MB, 300 * MB, 100 * MB, 500 * MB)
    assert not b["fits"] and b["free_percent"] == 50.0 and b["short"] == "500 MiB"
    assert sum(s["percent"] for s in b["segments"]) == 100.0


def test_plan_view_of_a_plan_and_of_a_refusal():
    v = plan_view(rich_state(), CTX)["plan"]
    assert not v["refused"] and v["context"] == 2048 and v["layers_total"] == 30
    assert [s["layers"] for s in v["stages"]] == ["0–16", "17–29"] and v["stages"][0]["coordinator"]
    assert round(sum(s["map_percent"] for s in v["stages"])) == 100
    refused = plan_view(rich_state().model_copy(update={"plan": plan("refusal")}), CTX)["plan"]
    assert refused["refused"] and refused["issues"] == ["stage 1 needs 800 MiB, node-b has 600 MiB free"]
    assert not refused["stages"][1]["bar"]["fits"]


def test_launch_summary_names_the_failed_step_and_the_rolled_back_ones():
    ok = launch_summary(cluster())
    assert ok == {"done": 7, "total": 7, "running": None, "failed": None, "failed_detail": "", "rolled_back": [],
                  "skipped": 0}
    bad = launch_summary(failed_cluster())
    assert bad["failed"] == "Stage 1 transport listening on port 39602"
    assert bad["failed_detail"] == "Address already in use"
    assert len(bad["rolled_back"]) == 3 and bad["skipped"] == 3 and bad["done"] == 0


def test_the_monitor_shows_the_live_cluster_else_the_last_ended_one():
    st = rich_state()
    assert monitor_view(st, CTX)["session"]["id"] == "s1"
    ended = monitor_view(st.model_copy(update={"sessions": ()}), CTX)["session"]
    assert ended["id"] == "s0" and not ended["live"] and not ended["observed"]
    assert monitor_view(st.model_copy(update={"sessions": (), "history": ()}), CTX) == {"session": None}


def test_the_form_shows_the_plans_choice_and_launch_waits_for_preparation():
    v = form_view(rich_state(), CTX)
    assert v["selected_model"] == "smol" and v["selected_nodes"] == ["n0", "n1"] and v["context"] == 2048
    assert [m["id"] for m in v["unsupported"]] == ["big.gguf"]
    assert v["choose"](None)["blocked"].startswith("node-a and node-b already serve smol")
    assert [n["support"] for n in v["nodes"]][:2] == ["Supported", "Supported"]
    assert v["nodes"][2]["support"].startswith("Unsupported: unreachable")


def test_prepare_rows_keep_why_a_node_copies():
    rows = prepare_view(rich_state(), CTX)["prep"]["rows"]
    assert rows[1]["label"] == "Downloading" and rows[1]["verdict_label"] == "Needs download"
    assert rows[1]["percent"] == 37 and rows[1]["rate"] == "100 MiB/s"


def test_live_components_refresh_on_the_events_that_touch_them():
    """Each live component's kinds come from the webapp's table of what each event touches
    (webapp/touches.py); none is lost from the sets written by hand before, and only live
    components are named."""

    live = {c.name: c.kinds for c in COMPONENTS if c.live}
    assert set(live) == LIVE_COMPONENTS and all(live.values())
    assert all(not c.kinds for c in COMPONENTS if not c.live)  # a form is never pushed
    sessions = {"session_created", "launch_stepped", "session_registered", "session_observed", "session_faulted",
                "health_changed", "session_removed", "post_mortem_recorded", "recovery_failed", "session_recovered"}
    downloads = {"model_download_started", "model_download_progressed", "model_download_listed",
                 "model_download_finished"}
    before = {"settings-status": {"settings_changed"}, "distributed-gate": {"settings_changed"},
              "nodes": {"node_registered", "node_removed", "node_reported", "node_unreachable", "node_discovered",
                        "node_vanished", "session_created", "session_removed"},
              "cluster-options": {"settings_changed", "node_registered", "node_removed", "node_reported",
                                  "node_unreachable", "plan_previewed", "preparation_started", "preparation_finished",
                                  "session_created", "session_removed"},
              "plan-preview": {"plan_previewed"},
              "prepare-status": {"preparation_started", "preparation_progressed", "preparation_finished"},
              "cluster-monitor": sessions, "sessions": sessions,
              "local-models": {"node_registered", "node_removed", "node_reported", "node_unreachable",
                               "session_created", "health_changed", "session_removed", "preparation_finished",
                               "preparation_progressed"} | downloads,
              "model-downloads": downloads | {"node_registered", "node_removed"}}
    for name, kinds in before.items():
        assert kinds <= live[name], f"{name} no longer refreshes on {kinds - live[name]}"


def test_the_form_answers_for_the_users_own_selection_and_a_hub_repo_chooses_its_model():
    from werkzeug.datastructures import MultiDict

    from orchestrator.control.rules.state import NodePreparation, Preparation

    st = rich_state().model_copy(update={"sessions": (), "preparation": Preparation(
        model_id="smol", finished=True,
        nodes=tuple(NodePreparation(node_id=n, status="present") for n in ("n0", "n1")))})
    choose = form_view(st, CTX)["choose"]
    form = MultiDict([("model", "smol"), ("nodes", "n0"), ("nodes", "n1"), ("context_length", "2048")])
    assert choose(form)["blocked"] is None and choose(form)["context"] == 2048
    # a Hub repo typed last chooses its model, offered before any node has it
    typed = form.copy()
    typed["hub_repo"], typed["changed"] = "mlx-community/Other-4bit", "hub_repo"
    c = choose(typed)
    assert c["model"] == "Other-4bit" and c["hub_option"] == "Other-4bit" and c["hub_note"] == ""
    assert c["blocked"].startswith("Preview shard plan of Other-4bit on node-a, node-b at 2048 tokens first")
    # the model chosen after it: the repo disagrees, said at the field and by Launch
    typed["changed"] = "model"
    c = choose(typed)
    assert c["model"] == "smol" and c["hub_note"].startswith("Hub repo mlx-community/Other-4bit is the model Other")
    assert c["blocked"] == c["hub_note"]
    typed["hub_repo"], typed["changed"] = "not a repo", "hub_repo"
    assert choose(typed)["hub_note"].startswith("Hub repo: hub repo id 'not a repo'")


def test_stage_cards_during_a_launch_say_what_the_launch_saw():
    from webapp.views.sessions import stage_rows

    s = cluster(phase="launching", health="Starting")
    states = {"stage-0.start": "done", "stage-0.listen": "done", "stage-1.start": "done"}
    steps = tuple(t.model_copy(update={"state": states.get(t.key, "pending")}) for t in s.timeline)
    rows = stage_rows(s.model_copy(update={"timeline": steps, "stage_status": ()}))
    assert [(r["alive"], r["listening"]) for r in rows] == [(True, True), (True, None)]
    # the watcher's own look wins once it has one
    from orchestrator.control.rules.state import StageStatus

    seen = s.model_copy(update={"timeline": steps, "stage_status": (StageStatus(alive=False, port_listening=False),)})
    assert (stage_rows(seen)[0]["alive"], stage_rows(seen)[0]["listening"]) == (False, False)


def test_the_pending_prediction_says_what_is_measured_on_which_node():
    from webapp.views.plan import measuring_text

    # node-a holds smol, nothing measured yet, no cluster serving (beside one it is not timed:
    # tests/webapp/test_timing_note.py)
    st = rich_state().model_copy(update={"sessions": ()})
    assert measuring_text(st, "smol", ["n0", "n1"]) == (
        "Predicted performance: measuring the links between node-a, node-b; timing smol's layers on node-a "
        "(a minute or more on a busy machine)…")
    assert "no selected node holds other yet" in measuring_text(st, "other", ["n0", "n1"])


def test_a_prediction_that_contradicts_itself_is_flagged_and_the_verdict_is_always_said():
    from orchestrator.planner.predict import Performance, Point
    from webapp.views.perf import performance_view

    def perf(one: float, four: float) -> Performance:
        return Performance(decode_tps_1=one, ms_per_token_1=1000 / one, compute_ms_1=1.0,
                           aggregate_tps=(Point(x=1, y=one), Point(x=4, y=four)), ttft_s=(Point(x=1024, y=942.72),),
                           stage_ms_1=(1.0,), boundaries=(), bottleneck="stage 0")

    odd = performance_view(perf(0.5, 23.9))  # the figures: 48x at 4 requests
    assert odd["inconsistent"].startswith("23.9 tok/s at 4 requests is 48x the 0.5 tok/s of one request")
    assert performance_view(perf(10.0, 36.0))["inconsistent"] == ""
    assert odd["ttft"][0]["seconds"] == "15 min 43 s"  # not "942.72 s"
    assert odd["single_node"].startswith("no selected node could hold the whole model alone")


def test_a_link_too_fast_to_measure_says_so_with_the_figure_the_plan_uses():
    from orchestrator.agent.perf_schemas import LinkSample
    from webapp.views.perf import link_matrix

    st = rich_state()
    a, b = st.nodes[0], st.nodes[1]

    def with_link(lower: bool):
        s = LinkSample(node_id=b.id, url=b.url, rtt_ms=0.004, http_rtt_ms=0.4, bandwidth_Bps=9.8304e9,
                       bandwidth_lower_bound=lower)
        na = a.model_copy(update={"report": a.report.model_copy(update={"links": [s]})})
        return link_matrix(st.model_copy(update={"nodes": (na, b)}), [a.id, b.id])["rows"][0][1]["text"]

    assert with_link(True) == "0.00 ms · too fast to measure (≥ 78.64 Gbit/s)"
    assert with_link(False) == "0.00 ms · 78.64 Gbit/s"


def test_the_link_matrix_and_the_plan_take_the_round_trip_on_the_transports_path():
    from orchestrator.agent.perf_schemas import LinkSample
    from orchestrator.control.rules.measured import links_of
    from webapp.views.perf import link_matrix

    st = rich_state()
    a, b = st.nodes[0], st.nodes[1]
    # behind a user-space relay the kernel sees 0.05 ms to the relay; the framed echo sees the 4 ms
    s = LinkSample(node_id=b.id, url=b.url, rtt_ms=0.05, http_rtt_ms=0.4, path_rtt_ms=4.2, path="10.78.0.2:39629",
                   bandwidth_Bps=1.25e8)
    na = a.model_copy(update={"report": a.report.model_copy(update={"links": [s]})})
    cell = link_matrix(st.model_copy(update={"nodes": (na, b)}), [a.id, b.id])["rows"][0][1]
    assert cell["text"] == "4.20 ms · 1.00 Gbit/s" and "on the transport path to 10.78.0.2:39629" in cell["title"]
    assert links_of(na, {a.id, b.id})[b.id].rtt_ms == 4.2  # the same figure for the boundary table
    older = s.model_copy(update={"path_rtt_ms": None, "path": ""})  # a peer without the echo: the kernel's
    assert older.plan_rtt_ms == 0.05


def test_layers_timed_on_a_busy_machine_are_said_to_make_a_doubtful_prediction():
    from orchestrator.agent.perf_schemas import ComputeProfile
    from webapp.views.plan import busy_timing

    st = rich_state()
    a = st.nodes[0]

    def timed(load: float, b1: float = 1, doubt: str = "", tries: int = 1) -> str:
        p = ComputeProfile(model_id="smol", layer_ms_b1_solo=1, layer_ms_b1=b1, layer_ms_bB=1, prefill_ms_per_token=1,
                           load=load, cpus=2, doubt=doubt, tries=tries)
        na = a.model_copy(update={"report": a.report.model_copy(update={"compute": [p]})})
        return busy_timing(st.model_copy(update={"nodes": (na, *st.nodes[1:])}), "smol", ["n0", "n1"])

    assert timed(3.2).startswith("measured on a busy machine: node-a's timing of the layers (load 3.2 on 2 CPUs)")
    assert timed(0.4) == ""
    # one row timed slower than eight (an older agent's profile, no doubt of its own): the same rule says so
    assert "a step of 8 rows timed faster" in timed(0.4, b1=2)
    # the agent's doubt after its retries, with how many timings it took
    said = timed(0.4, doubt="load 3.0 on 2 CPUs", tries=3)
    assert "(load 3.0 on 2 CPUs, still after 3 timings)" in said and "not to be trusted" in said


def test_a_stage_card_shows_its_prompt_cache():
    from orchestrator.control.rules.state import StageCache
    from webapp.views.sessions import cache_text

    assert cache_text(None) is None
    text = cache_text(StageCache(entries=2, bytes=3 * MB, hits=1, tokens_reused=2048))
    assert text.startswith("2 entries · ") and "1 hit · 2,048 tokens reused" in text


def test_the_last_stage_card_shows_how_speculation_verifies():
    from orchestrator.control.rules.state import Speculation
    from webapp.views.sessions import speculation_text, stage_rows

    assert speculation_text(None) is None
    assert speculation_text(Speculation(max_drafts=4)) == "on (up to 4 drafts per pass), no pass verified yet"
    assert "cannot verify drafts exactly: it never drafts" in speculation_text(Speculation(max_drafts=4, refused=True))
    why = speculation_text(Speculation(max_drafts=4, refused=True, refusal="its chunks are not its steps"))
    assert "exactly (its chunks are not its steps): it never drafts" in why
    s = cluster()
    spec = Speculation(max_drafts=4, passes=200, drafted=500, accepted=260)
    last = s.stage_status[1].model_copy(update={"speculation": spec})
    rows = stage_rows(s.model_copy(update={"stage_status": (s.stage_status[0], last)}))
    assert rows[0]["speculation"] is None
    assert rows[1]["speculation"] == "52% of 500 drafts accepted · 2.30 tokens per pass · 200 passes"
    ended = stage_rows(s.model_copy(update={"phase": "stopped", "stage_status": (s.stage_status[0], last)}))
    assert ended[1]["speculation"] is None  # history: the processes are gone


def test_the_prediction_says_what_speculation_gains_per_workload_and_where_it_loses():
    from orchestrator.planner.predict import Performance, Point
    from orchestrator.planner.speculation_gain import Gain
    from webapp.views.perf import performance_view

    base = Performance(decode_tps_1=10.0, ms_per_token_1=100.0, compute_ms_1=90.0, aggregate_tps=(Point(x=4, y=30),),
                       ttft_s=(), stage_ms_1=(45.0, 45.0), boundaries=(), bottleneck="stage 0")
    assert performance_view(base)["speculation"] == []
    v = performance_view(base.model_copy(update={"speculation": (
        Gain(workload="code edit", tokens_per_pass=2.4, decode_tps=16.0, gain=1.6),
        Gain(workload="free chat", tokens_per_pass=1.1, decode_tps=8.0, gain=0.8))}))["speculation"]
    assert v == [{"workload": "code edit", "gain": "1.60", "tps": "16.0", "per_pass": "2.40", "loses": False},
                 {"workload": "free chat", "gain": "0.80", "tps": "8.0", "per_pass": "1.10", "loses": True}]
