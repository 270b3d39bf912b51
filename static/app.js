// The little glue the dashboard needs. Show whether the live socket is connected.
function liveState(on) {
  const el = document.getElementById("live-indicator");
  if (!el) return;
  el.classList.toggle("on", on);
  el.classList.toggle("lost", !on);
  el.querySelector(".live-text").textContent = on ? "Live" : "Reconnecting…";
}
document.body.addEventListener("htmx:wsOpen", () => liveState(true));
document.body.addEventListener("htmx:wsClose", (e) => {
  const code = e.detail.event?.code;
  if (code === 4401) { location.assign("/login"); return; }  // the session ended (log out, revoked, reset)
  liveState(false);
  if (code === 4429) {  // refused: say why instead of "Reconnecting…"
    const text = document.querySelector("#live-indicator .live-text");
    if (text) text.textContent = "Not live: " + (e.detail.event.reason || "too many connections");
  }
});

// A link shown once is selected on click, ready to copy (no inline handlers: see the CSP); its
// Copy button copies it (the clipboard API needs https or localhost: else the selection's copy).
document.addEventListener("click", async (e) => {
  if (e.target.matches?.("input.copy")) e.target.select();
  const button = e.target.closest?.("[data-copy]");
  const field = button && document.querySelector(button.dataset.copy);
  if (!field) return;
  field.select();
  try { await navigator.clipboard.writeText(field.value); } catch (err) { document.execCommand("copy"); }
  button.textContent = "Copied";
});

// The Distributed tab was drawn with distributed serving on or off; when a push says it changed
// (another admin saved Settings), load the page again so the tab appears or hides.
document.body.addEventListener("htmx:oobBeforeSwap", (e) => {
  const old = e.detail.target, fresh = e.detail.fragment?.querySelector?.("#distributed-gate");
  if (old?.id === "distributed-gate" && fresh && fresh.dataset.distributed !== old.dataset.distributed) location.reload();
});

// Open drawers and chosen tabs survive re-renders (a live push or an action's answer).
const openDrawers = new Set();
const chosenTabs = new Map();
function applyUi(root) {
  for (const d of root.querySelectorAll("details[data-keep]")) {
    // The drawer on the page says best whether it is open: its "toggle" event comes a task after
    // the click, and a push swapped in before that closed a drawer just opened (e2e test_recovery).
    const shown = document.querySelector(`details[data-keep="${CSS.escape(d.dataset.keep)}"]`);
    if (shown && shown !== d) shown.open ? openDrawers.add(d.dataset.keep) : openDrawers.delete(d.dataset.keep);
    d.open = openDrawers.has(d.dataset.keep);
  }
  for (const box of root.querySelectorAll("[data-tabs]")) {
    const tab = chosenTabs.get(box.dataset.tabs);
    if (!tab) continue;
    for (const t of box.querySelectorAll("[role=tab][data-tab]")) {
      t.classList.toggle("active", t.dataset.tab === tab);
      t.setAttribute("aria-selected", t.dataset.tab === tab ? "true" : "false");
    }
    for (const p of box.querySelectorAll("[data-panel]")) p.hidden = p.dataset.panel !== tab;
  }
}
document.addEventListener("toggle", (e) => {
  const d = e.target;
  if (d.matches?.("details[data-keep]")) d.open ? openDrawers.add(d.dataset.keep) : openDrawers.delete(d.dataset.keep);
}, true);
document.addEventListener("click", (e) => {
  const tab = e.target.closest("[role=tab][data-tab]");
  const box = tab?.closest("[data-tabs]");
  if (!box) return;
  chosenTabs.set(box.dataset.tabs, tab.dataset.tab);
  applyUi(box.parentElement);
});
document.body.addEventListener("htmx:oobBeforeSwap", (e) => { if (e.detail.fragment) applyUi(e.detail.fragment); });
document.body.addEventListener("htmx:afterSwap", () => applyUi(document));

// A new attempt clears the message of the last refused one (and any page notice).
document.body.addEventListener("htmx:beforeRequest", (e) => {
  const elt = e.detail.elt;
  for (const scope of [elt.closest?.("form"), elt.closest?.("section[id]")]) {
    scope?.querySelectorAll(".flash.error").forEach((f) => f.remove());
  }
  document.getElementById("notices")?.replaceChildren();
});
// A live push of a component never carries the refusal of an action taken in it (only that
// action's answer does): keep each refusal in its slot until the next action, or a node report
// arriving a moment after the answer wipes the message before it is read (e2e test_one_selection).
document.body.addEventListener("htmx:oobBeforeSwap", (e) => {
  const fresh = e.detail.fragment;
  if (!fresh?.querySelector) return;
  for (const slot of e.detail.target.querySelectorAll?.("[data-flash-slot]") || []) {
    const message = slot.querySelector(".flash.error");
    const kept = message && fresh.querySelector(`[data-flash-slot="${CSS.escape(slot.dataset.flashSlot)}"]`);
    if (kept && !kept.querySelector(".flash.error")) kept.replaceChildren(message.cloneNode(true));
  }
});

// One selection on the Distributed page. The Shard plan and Preparation cards are shared (every
// viewer sees the last ones) and say which model, nodes and context they are of; beside another
// choice in this page's form they are marked stale (their note says for what), and Launch is
// disabled at once until the server's answer for the new choice (views/cluster.choice_view) lands.
function chosenSelection() {
  const form = document.getElementById("cluster-selection");
  if (!form) return null;
  return {
    model: form.querySelector("#model")?.value || "",
    nodes: [...form.querySelectorAll("input[name=nodes]:checked")].map((n) => n.value),
    context: form.querySelector("#context_length")?.value || "",
  };
}
function markStale() {
  const chosen = chosenSelection();
  if (!chosen) return;
  for (const id of ["plan-preview", "prepare-status"]) {
    const card = document.getElementById(id);
    if (!card || !card.dataset.model) continue;
    const theirs = card.dataset.nodes.split(",").filter(Boolean);
    const sameNodes = card.dataset.covers  // a preparation of more nodes covers a subset
      ? chosen.nodes.length > 0 && chosen.nodes.every((n) => theirs.includes(n))
      : chosen.nodes.length === theirs.length && chosen.nodes.every((n) => theirs.includes(n));
    const stale = card.dataset.model !== chosen.model || !sameNodes
      || (card.dataset.context !== undefined && card.dataset.context !== chosen.context);
    card.classList.toggle("stale", stale);
    card.querySelector(".stale-note")?.toggleAttribute("hidden", !stale);
  }
  // An answer for an earlier choice (a live refresh sent before the last change) must not enable
  // Launch: the answer for the current one is on its way.
  const launch = document.getElementById("launch-button");
  const current = `${chosen.model}|${[...chosen.nodes].sort().join(",")}|${chosen.context}`;
  if (launch && !launch.disabled && launch.dataset.for !== current) {
    launch.disabled = true;
    launch.title = "checking the new selection…";
    const watch = document.getElementById("selection-watch");
    if (watch) htmx.trigger(watch, "change");  // ask again for the current choice
  }
}
// A Hub repo typed chooses its model at once (the server says the same: views/cluster.selection_from):
// what the cards, Prepare and Launch are about never differs from what the Model field shows.
function chooseHubModel(form, repo) {
  const id = repo.trim().includes("/") ? repo.trim().split("/").pop() : "";
  const select = form.querySelector("#model");
  if (!id || !select) return;
  if (![...select.options].some((o) => o.value === id)) {
    select.add(new Option(`${id} — on no node yet: Prepare downloads it from ${repo.trim()}`, id));
  }
  select.value = id;
}
// What the user changes in the form beats every answer to a request sent before the change: a live
// refresh of the choices (cluster_options.html) that left with the old input would put it back (a
// node report's push crossed an unchecked node on a loaded machine: e2e test_rough_edges test_3, and
// the next refresh then sent the restored input). Such an answer is dropped and asked again.
let formEdits = 0;
const editsWhenSent = new WeakMap();
document.body.addEventListener("htmx:beforeRequest", (e) => {
  if (e.detail.elt?.id === "cluster-options") editsWhenSent.set(e.detail.xhr, formEdits);
});
document.body.addEventListener("htmx:beforeSwap", (e) => {
  const sent = editsWhenSent.get(e.detail.xhr);
  if (sent === undefined || sent === formEdits) return;
  e.detail.shouldSwap = false;
  if (e.detail.elt?.isConnected) htmx.trigger(e.detail.elt, "refresh");
});
document.addEventListener("change", (e) => {
  const form = e.target.closest?.("#cluster-selection");
  if (!form) return;
  formEdits++;
  const changed = form.querySelector("input[name=changed]");
  if (changed && e.target.name) changed.value = e.target.name;  // read by the request htmx is about to send
  if (e.target.id === "hub_repo") chooseHubModel(form, e.target.value);
  const launch = document.getElementById("launch-button");
  if (launch) { launch.disabled = true; launch.title = "checking the new selection…"; }
  markStale();
}, true);
document.addEventListener("input", (e) => {
  if (!e.target.closest?.("#cluster-selection")) return;
  formEdits++;
  markStale();
}, true);
document.body.addEventListener("htmx:afterSwap", markStale);
document.body.addEventListener("htmx:afterSettle", markStale);
document.body.addEventListener("htmx:oobAfterSwap", markStale);
markStale();
