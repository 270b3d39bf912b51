"""View models (pure): memory-fit bars, the launch summary, the form's current choice."""

from __future__ import annotations

from webapp.views.cluster import form_view, launch_summary, monitor_view, prepare_view
from webapp.views.context import ViewContext
from webapp.views.plan import fit_bar, plan_view

from .states import cluster, failed_cluster, plan, rich_state

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
    assert [m["id"] for m in v["unsupported"]] == ["big.gguf"] and not v["launch_ready"]
    assert [n["support"] for n in v["nodes"]][:2] == ["Supported", "Supported"]
    assert v["nodes"][2]["support"].startswith("Unsupported: unreachable")


def test_prepare_rows_keep_why_a_node_copies():
    rows = prepare_view(rich_state(), CTX)["prep"]["rows"]
    assert rows[1]["label"] == "Downloading" and rows[1]["verdict_label"] == "Needs download"
    assert rows[1]["percent"] == 37 and rows[1]["rate"] == "100 MiB/s"


def test_live_components_refresh_on_the_events_that_touch_them():
    """Each live component's kinds come from the event classes (`touches`); none is lost from
    the sets written by hand before, and only live components are named."""
    from orchestrator.control.events import LIVE_COMPONENTS
    from webapp.components import COMPONENTS

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
