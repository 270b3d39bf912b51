// Live components that never destroy what the user is doing, and never show a stale truth.
//
// 1. A pushed component (an out-of-band swap of its stable element id) is MORPHED into the page:
//    only the attributes and text that changed are written; a node whose text is selected keeps
//    its text until the selection ends, a focused field keeps its value, an open <details> stays
//    open (app.js applyUi). Replacing the whole component 1.5 times a second made the coordinator's
//    URL impossible to select and copy (issue 38 item 3).
// 2. While the live feed is gone (the dashboard stopped, the network lost), every live component
//    is marked stale — dimmed, "last update N s ago" — until the feed is back and has sent every
//    component again (issue 38 item 2).
(function () {
  "use strict";

  // --- morphing ---------------------------------------------------------------------------
  function underSelection(node) {
    const sel = document.getSelection();
    return !!sel && !sel.isCollapsed && sel.rangeCount > 0 && sel.containsNode(node, true);
  }
  function isField(el) {
    return el.nodeType === 1 && /^(INPUT|SELECT|TEXTAREA)$/.test(el.tagName);
  }
  function sameKind(a, b) {
    if (a.nodeType !== b.nodeType) return false;
    if (a.nodeType !== 1) return true;
    return a.tagName === b.tagName && (a.id || "") === (b.id || "");
  }
  function syncAttributes(from, to) {
    if (isField(from) && from === document.activeElement) return;  // the user's hands are on it
    for (const { name } of [...from.attributes]) if (!to.hasAttribute(name)) from.removeAttribute(name);
    for (const { name, value } of [...to.attributes]) if (from.getAttribute(name) !== value) from.setAttribute(name, value);
    if (isField(from) && "value" in to && from.value !== to.value) from.value = to.value;
  }
  function morphNode(from, to) {
    if (from.nodeType !== 1) {
      // text under a selection keeps its words until the selection ends (then the next push writes it)
      if (from.nodeValue !== to.nodeValue && !underSelection(from)) from.nodeValue = to.nodeValue;
      return;
    }
    syncAttributes(from, to);
    morphChildren(from, to);
  }
  function morphChildren(from, to) {
    const old = [...from.childNodes], fresh = [...to.childNodes];
    fresh.forEach((n, i) => {
      const o = old[i];
      if (!o) from.appendChild(n);
      else if (sameKind(o, n)) morphNode(o, n);
      else if (!underSelection(o)) from.replaceChild(n, o);
    });
    for (const o of old.slice(fresh.length)) if (!underSelection(o)) o.remove();
  }

  // Only what the live socket pushes (display components) is morphed: an action's answer (a form's
  // own fields, chosen by the server from the user's input) is swapped as htmx does, and so is a
  // component that asks for something when it lands (hx-trigger "load": the form's refresh).
  let fromSocket = false;
  document.body.addEventListener("htmx:wsBeforeMessage", () => { fromSocket = true; });
  document.body.addEventListener("htmx:wsAfterMessage", () => { fromSocket = false; });

  // Registered after app.js's own oobBeforeSwap listeners (drawers, tabs, kept refusals have
  // already adjusted the fragment): the morph writes the result into the page instead of htmx.
  document.body.addEventListener("htmx:oobBeforeSwap", (e) => {
    const target = e.detail.target, fresh = e.detail.fragment?.firstElementChild;
    if (!fromSocket || !target?.id || !fresh || fresh.id !== target.id || !e.detail.shouldSwap) return;
    if (/\bload\b/.test(fresh.getAttribute("hx-trigger") || "")) return;
    e.detail.shouldSwap = false;
    target.querySelector(":scope > .feed-note")?.remove();  // fresh again: before the morph, which maps children by place
    morphNode(target, fresh);
    htmx.process(target);  // hx- attributes of what is new
    htmx.trigger(target, "htmx:oobAfterSwap", { target });  // what listens for a component's push (chat.js)
  });

  // --- elapsed times: "[data-since]" (epoch seconds) counts up, e.g. a layer timing under way ---
  setInterval(() => {
    for (const el of document.querySelectorAll("[data-since]")) {
      const s = Math.max(0, Math.round(Date.now() / 1000 - Number(el.dataset.since)));
      el.textContent = `— ${s < 60 ? s + " s" : Math.floor(s / 60) + " min " + (s % 60) + " s"} so far`;
    }
  }, 1000);

  // --- a lost feed ------------------------------------------------------------------------
  let lastMessage = Date.now(), ticker = null;
  function liveComponents() {
    const main = document.querySelector("main[ws-connect]");
    const names = (main?.getAttribute("ws-connect").split("components=")[1] || "").split(",");
    return names.map((n) => document.getElementById(n)).filter((el) => el && !el.hidden);
  }
  function ago() {
    const s = Math.round((Date.now() - lastMessage) / 1000);
    return s < 90 ? `${s} s` : `${Math.round(s / 60)} min`;
  }
  function markLost() {
    for (const el of liveComponents()) {
      el.classList.add("stale-feed");
      let note = el.querySelector(":scope > .feed-note");
      if (!note) {
        note = document.createElement("p");
        note.className = "feed-note";
        note.setAttribute("role", "status");
        el.prepend(note);
      }
      note.textContent = `Not live: last update ${ago()} ago — the dashboard cannot be reached; reconnecting…`;
    }
  }
  document.body.addEventListener("htmx:wsAfterMessage", () => { lastMessage = Date.now(); });
  document.body.addEventListener("htmx:wsClose", (e) => {
    if (e.detail.event?.code === 4401) return;  // logged out: app.js goes to the login page
    markLost();
    ticker ??= setInterval(markLost, 1000);
  });
  document.body.addEventListener("htmx:wsOpen", () => {
    clearInterval(ticker);
    ticker = null;
    // the server sends every component first; until each lands it stays marked (morph clears it)
  });
})();
