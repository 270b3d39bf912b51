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

// A live push replaces a component while someone may be typing or choosing in it: carry over
// what the user changed (text, number, select, checkboxes) and the focus into the new copy.
// (Not when the user just submitted that component: its answer replaces it anyway.)
document.body.addEventListener("htmx:beforeRequest", (e) => e.detail.target?.setAttribute("data-awaiting", ""));
document.body.addEventListener("htmx:afterRequest", (e) => e.detail.target?.removeAttribute("data-awaiting"));
document.body.addEventListener("htmx:oobBeforeSwap", (e) => {
  const old = e.detail.target, fresh = e.detail.fragment;
  if (!old || !fresh || old.hasAttribute("data-awaiting")) return;
  const active = old.contains(document.activeElement) ? document.activeElement : null;
  const match = (el) => {
    if (el.type === "checkbox" || el.type === "radio") {
      return [...fresh.querySelectorAll(`input[name="${CSS.escape(el.name)}"]`)].find((n) => n.value === el.value);
    }
    return el.id ? fresh.querySelector("#" + CSS.escape(el.id)) : el.name ? fresh.querySelector(`[name="${CSS.escape(el.name)}"]`) : null;
  };
  // A form the server marked data-touched (re-rendered with the user's refused input) is the
  // user's as a whole, even where its values equal the rendered defaults.
  const mine = (el) => el.form?.hasAttribute("data-touched");
  for (const el of old.querySelectorAll("input, select, textarea")) {
    if (el.type === "hidden") continue;
    const twin = match(el);
    if (!twin) continue;
    if (mine(el)) twin.form?.setAttribute("data-touched", "");
    if (el.type === "checkbox" || el.type === "radio") {
      if ((el.checked !== el.defaultChecked || mine(el)) && !twin.disabled) twin.checked = el.checked;
    } else if (el.tagName === "SELECT") {
      const chosen = [...el.options].find((o) => o.selected);
      if (chosen && (!chosen.defaultSelected || mine(el)) && [...twin.options].some((o) => o.value === el.value && !o.disabled)) twin.value = el.value;
    } else if (el.value !== el.defaultValue || mine(el)) {
      twin.value = el.value;
    }
    if (el === active) twin.dataset.refocus = "1";
  }
});
document.body.addEventListener("htmx:oobAfterSwap", () => {
  const el = document.querySelector("[data-refocus]");
  if (el) { delete el.dataset.refocus; el.focus(); }
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
