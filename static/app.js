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

// A link shown once is selected on click, ready to copy (no inline handlers: see the CSP).
document.addEventListener("click", (e) => { if (e.target.matches?.("input.copy")) e.target.select(); });

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
  for (const d of root.querySelectorAll("details[data-keep]")) d.open = openDrawers.has(d.dataset.keep);
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
  e.detail.elt.closest?.("form, section")?.querySelectorAll(".flash.error").forEach((f) => f.remove());
  document.getElementById("notices")?.replaceChildren();
});
