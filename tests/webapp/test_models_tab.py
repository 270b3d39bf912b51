"""Models → Local: the model list (holders, verified, support, what blocks Serve and Delete),
download progress (bytes, %, rate, time left), the page for admins and viewers, and actions
refused in place. The real flow against agents and the Hub stand-in: tests/control/test_models.py
and e2e/test_models.py."""

from __future__ import annotations

from orchestrator.agent.hub import HubFile, HubListing
from orchestrator.control.rules.download_state import HubRef, ModelDownload, NodeDownload
from orchestrator.control.rules.state import Session, StagePlacement
from tests.support.builders import node
from tests.support.html import parse
from tests.webapp.conftest import Web, csrf_of
from webapp.views.context import ViewContext
from webapp.views.models import downloads_view, duration, listing_view, models_view


def state_with_models(web_state):
    a = node("node-a", node_id="fa", models=["smollm2", "tiny"])
    b = node("node-b", node_id="fb", models=["tiny", "weird.gguf"])
    dl = ModelDownload(model_id="tiny", hub=HubRef(repo_id="org/tiny"), commit="c" * 40, total_bytes=1000, files=4,
                       phase="running", nodes=(NodeDownload(node_id="fa", status="verified", source="hub org/tiny",
                                                            done_bytes=1000, total_bytes=1000),
                                               NodeDownload(node_id="fb", status="copying", source="LAN from node-a",
                                                            done_bytes=250, total_bytes=1000, rate_bps=5e6,
                                                            eta_s=150.0)))
    session = Session(id="s1", name="smollm2-single", model_id="smollm2", model_name="smollm2", cluster=False,
                      stages=(StagePlacement(index=0, node_id="fa", node_name="node-a", first_layer=0, last_layer=29,
                                             host="10.0.0.6", port=39600),),
                      coordinator_node="fa", coordinator_host="10.0.0.6", coordinator_port=39601, phase="running",
                      health="Healthy")
    from orchestrator.control.rules.state import VerifiedCopy

    return web_state.model_copy(update={"nodes": (a, b), "downloads": (dl,), "sessions": (session,),
                                        "verified": (VerifiedCopy(model_id="tiny", node_id="fa"),)})


def test_the_list_names_holders_verification_support_and_what_blocks_an_action(web: Web):
    state = state_with_models(web.orch.state)
    rows = {m["id"]: m for m in models_view(state, ViewContext(role="admin"))["models"]}
    assert list(rows) == ["smollm2", "tiny", "weird.gguf"]
    tiny = {h["node"]: h for h in rows["tiny"]["holders"]}
    assert tiny["node-a"]["verified"] and not tiny["node-b"]["verified"]  # b is still copying
    assert tiny["node-b"]["delete_blocked"] == "being downloaded"
    (served,) = rows["smollm2"]["holders"]
    assert served["session"] == "smollm2-single" and "stop it first" in served["delete_blocked"]
    assert served["serve_blocked"] == "serving as smollm2-single"
    assert not rows["weird.gguf"]["supported"] and rows["weird.gguf"]["holders"][0]["serve_blocked"].startswith(
        "Unsupported: GGUF")


def test_download_progress_shows_bytes_percent_rate_and_time_left(web: Web):
    (row,) = downloads_view(state_with_models(web.orch.state), ViewContext())["downloads"]
    a, b = row["nodes"]
    assert row["running"] and row["repo"] == "org/tiny" and row["commit"] == "c" * 12
    assert a["label"] == "Verified" and a["source"] == "hub org/tiny" and a["percent"] == 100 and a["eta"] == ""
    assert b["label"] == "Copying" and b["percent"] == 25 and b["rate"] == "4.8 MiB/s" and b["eta"] == "2 min 30 s"
    assert b["source"] == "LAN from node-a"
    assert [duration(s) for s in (None, 5, 3700)] == ["–", "5 s", "1 h 1 min"]


def test_a_listing_says_what_it_would_fetch_and_what_stops_it():
    listing = HubListing(repo_id="org/x", revision="main", commit="a" * 40, total_bytes=3000, disk_free_bytes=100,
                         fits=False, mlx=False, reason="PyTorch weights only", gated=True, token=False,
                         files=[HubFile(path="config.json", size=1000), HubFile(path="w.bin", size=2000)])
    view = listing_view(listing, "node-a")
    assert [f["path"] for f in view["files"]] == ["w.bin", "config.json"] and view["blocking"]
    assert "PyTorch weights only" in view["problems"]  # the listing's own words, not "Not an MLX model: …"
    assert any("Gated repository" in p for p in view["problems"])
    assert any("Too big for node-a" in p for p in view["problems"])


def test_the_local_tab_for_admins_and_viewers(still: Web):
    still.orch._state = state_with_models(still.orch.state)
    admin = parse(still.client("admin").get("/models?tab=local").get_data(as_text=True))
    table = admin.by_id("local-models")
    assert table.find("tr", **{"data-model": "tiny"})
    buttons = [(b.text, b.disabled) for b in table.find_all("button")]
    assert ("Serve on this node", True) in buttons and ("Serve on this node", False) in buttons
    assert admin.by_id("download-form").find("input", name="repo_id")
    downloads = admin.by_id("model-downloads")
    assert "2 min 30 s left" in downloads.text and downloads.find("button").text == "Cancel"
    viewer = parse(still.client("viewer").get("/models?tab=local").get_data(as_text=True))
    assert not viewer.by_id("local-models").find_all("button") and not viewer.by_id("download-form").find_all("input")


def test_refusals_are_shown_in_place_and_change_nothing(web: Web):
    admin = web.client("admin")
    headers = {"X-CSRF-Token": csrf_of(admin), "HX-Request": "true"}
    r = admin.post("/models/download", data={"repo_id": "not a repo"}, headers=headers)
    assert r.status_code == 400
    (alert,) = parse(r.get_data(as_text=True)).by_id("model-downloads").by_role("alert")
    assert "expected org/name" in alert.text
    r = admin.post("/models/hub-files", data={"repo_id": "org/x"}, headers=headers)
    assert r.status_code == 400 and "add a node first" in r.get_data(as_text=True)
    r = admin.post("/models/downloads/tiny/cancel", headers=headers)
    assert r.status_code == 409 and "no download of tiny is running" in r.get_data(as_text=True)
    assert web.orch.state.downloads == ()
    viewer = web.client("viewer")
    assert viewer.post("/models/download", data={"repo_id": "org/x"},
                       headers={"X-CSRF-Token": csrf_of(viewer)}).status_code == 403


def test_the_download_form_offers_nodes_added_later_without_replacing_what_is_typed(still: Web):
    """download-options is the form's live digest: pushed when the offered nodes change (a node
    registered, removed, or unreachable), it fetches the form with the user's input and swaps in
    only the node toggles (#download-nodes); the fields being typed are never in what it swaps."""
    from webapp.components import BY_NAME, render
    from webapp.views.models import download_options_view

    admin_ctx = ViewContext(role="admin")
    one = still.orch.state.model_copy(update={"nodes": (node("node-a", node_id="fa"),)})
    two = one.model_copy(update={"nodes": one.nodes + (node("node-b", node_id="fb"),)})
    down = two.model_copy(update={"nodes": (two.nodes[0], node("node-b", node_id="fb", reachable=False))})
    digests = [download_options_view(s, admin_ctx)["digest"] for s in (one, two, down)]
    assert len(set(digests)) == 3 and download_options_view(two, admin_ctx)["digest"] == digests[1]
    assert {"node_registered", "node_removed", "node_reported", "node_unreachable"} <= BY_NAME["download-options"].kinds
    assert not BY_NAME["download-form"].live  # the form itself is never pushed

    with still.app.test_request_context():
        pushed = parse(render("download-options", two, admin_ctx, oob=True)).by_id("download-options")
    assert pushed.attrs["hx-get"] == "/models/download-form" and pushed.attrs["hx-include"] == "#download-model"
    assert pushed.attrs["hx-swap"] == "none" and pushed.attrs["hx-select-oob"] == "#download-nodes"

    still.orch._state = two  # node-b registered after the page loaded
    page = parse(still.client("admin").get("/models?tab=local").get_data(as_text=True))
    assert page.by_id("download-options").attrs["data-digest"] == digests[1]
    typed = {"repo_id": "org/typed-by-hand", "revision": "", "model_id": "mine", "nodes": ["fa"]}
    fresh = parse(still.client("admin").get("/models/download-form", query_string=typed).get_data(as_text=True))
    toggles = {i.attrs["value"]: "checked" in i.attrs for i in fresh.by_id("download-nodes").find_all("input")}
    assert toggles == {"fa": True, "fb": False}  # the new node is offered, the user's choice kept
    assert fresh.by_id("download-form").find("input", name="repo_id").attrs["value"] == "org/typed-by-hand"


def test_a_holders_session_says_serving_only_once_healthy():
    from orchestrator.control.rules.state import StageStatus
    from tests.support.view_states import cluster
    from webapp.views.sessions import session_state

    running = cluster()
    assert session_state(running) == "Serving"
    assert session_state(running.model_copy(update={"stage_status": (StageStatus(alive=True),) * 2})) == "Checking"
    assert session_state(running.model_copy(update={"phase": "launching", "health": "Starting"})) == "Starting"
    assert session_state(running.model_copy(update={"phase": "stopping"})) == "Stopping"


def test_name_on_the_nodes_is_checked_at_the_field_before_anything_starts(rich):
    from tests.support.html import parse
    from tests.webapp.conftest import csrf_of

    admin = rich.client("admin")

    def note(query: str) -> str:
        r = admin.get("/models/name-check?" + query)
        assert r.status_code == 200
        return parse(r.get_data(as_text=True)).by_id("hub-name-note").text

    assert note("repo_id=org/fresh&nodes=n0") == "Saved as fresh on the nodes."
    # node-a holds smol: taken there, not on node-b
    assert note("repo_id=org/x&model_id=smol&nodes=n0").startswith(
        "Name on the nodes: node-a already has a model named smol: delete it first")
    assert note("repo_id=org/x&model_id=smol&nodes=n1") == "Saved as smol on the nodes."
    assert note("repo_id=org/x&model_id=../etc&nodes=n1").startswith("Name on the nodes: model name:")
    # List files refuses it too, before the hub is asked
    r = admin.post("/models/hub-files", data={"repo_id": "org/x", "model_id": "smol", "nodes": ["n0"]},
                   headers={"X-CSRF-Token": csrf_of(admin), "HX-Request": "true"})
    assert r.status_code == 400
    assert "Name on the nodes: node-a already has a model named smol" in r.get_data(as_text=True)
    assert rich.client("viewer").get("/models/name-check?repo_id=org/x").status_code == 403


def test_a_lan_follower_says_it_waits_for_the_first_node_and_finished_downloads_can_be_cleared(still: Web):
    state = state_with_models(still.orch.state)
    dl = state.downloads[0]
    waiting = dl.model_copy(update={"nodes": (dl.nodes[0].model_copy(update={"status": "downloading"}),
                                              dl.nodes[1].model_copy(update={"done_bytes": 0}))})
    rows = downloads_view(state.model_copy(update={"downloads": (waiting,)}), ViewContext(role="admin"))
    follower = rows["downloads"][0]["nodes"][1]
    assert follower["label"] == "Waiting" and follower["detail"].startswith("waiting for node-a to download and verify")
    assert not rows["finished"]
    # Clear finished: the finished ones go, a running one stays
    done = dl.model_copy(update={"model_id": "old", "phase": "done"})
    still.orch._state = state.model_copy(update={"downloads": (done, dl)})
    admin = still.client("admin")
    r = admin.post("/models/downloads/clear", headers={"X-CSRF-Token": csrf_of(admin), "HX-Request": "true"})
    assert r.status_code == 200 and [d.model_id for d in still.orch.state.downloads] == ["tiny"]
    assert 'data-download="old"' not in r.get_data(as_text=True)
