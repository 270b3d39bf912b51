// Chat: the Model picker follows what the router serves (live), replies stream in and are
// measured, Stop cancels one (closing the stream cancels the generation on the coordinator),
// and tool calls in a reply are shown as such.
(function () {
  const select = document.getElementById("chat-model");
  const log = document.getElementById("chat-log");
  const form = document.getElementById("chat-form");
  const box = document.getElementById("chat-message");
  const send = document.getElementById("chat-send");
  const stop = document.getElementById("chat-stop");
  const maxTokens = document.getElementById("chat-max-tokens");
  const empty = document.getElementById("chat-empty");
  const noModel = document.getElementById("chat-no-model");
  const gone = document.getElementById("chat-gone");
  const csrf = document.querySelector('meta[name="csrf-token"]').content;
  let history = [];
  let running = null;  // the AbortController of the reply streaming now
  let chosen = "";  // the model the user chats with: kept when it is gone, to say so
  let waiting = null;  // the progress line of the reply streaming now

  // What the router serves, and the models whose cluster is recovering (not listed by the router
  // meanwhile, back in seconds: kept in the picker, marked, never "no model is being served").
  async function loadModels() {
    let models = [], recovering = [], faulted = {};
    try {
      const r = await fetch(select.dataset.modelsUrl);
      const body = await r.json();
      models = body.models || [];
      recovering = body.recovering || [];  // the router may still list one for a moment
      faulted = body.faulted || {};
    } catch (err) { /* shown as "no model" below */ }
    const unlisted = recovering.filter((id) => !models.includes(id));
    const offered = models.length + unlisted.length;
    select.innerHTML = offered ? "" : '<option value="">no model is being served</option>';
    for (const id of models) select.add(new Option(id, id, false, id === chosen));
    for (const id of unlisted) select.add(new Option(`${id} (recovering)`, id, false, id === chosen));
    noModel.hidden = offered > 0;
    // the model chatted with stopped being served: say so instead of a raw router error on Send
    const lost = chosen && !models.includes(chosen);
    gone.hidden = !lost;
    if (lost) gone.textContent = recovering.includes(chosen)
      ? `The cluster serving ${chosen} is recovering: it serves again in seconds.`
      : `${chosen} is no longer served (stopped or gone)` + (models.length ? ": choose another model." : ".");
    else chosen = select.value;
    // a reply streaming while its cluster recovers is paused (the coordinator resumes it): say so
    // until its next token
    if (waiting && recovering.includes(chosen)) {
      waiting.textContent = "The cluster is recovering: this reply waits and resumes by itself…";
      waiting.dataset.paused = "1";
    }
    return { models, recovering, faulted };
  }

  // A reply that failed: why in words, and Retry (the same turn again). A cluster that lost a
  // process mid-reply recovers in seconds (sometimes in under one, before the page looks): a fault
  // of the model's cluster since the reply started explains it as well as "recovering" does.
  async function explainFailure(reply, out, text, message, startedAt) {
    out.textContent = "The reply was cut off.";
    for (let look = 0; look < 8; look++) {
      const { models, recovering, faulted } = await loadModels();
      if (recovering.includes(chosen)) {
        out.textContent = `The cluster is recovering (a process serving ${chosen} failed during this reply); ` +
          "it serves again in seconds: Retry.";
        break;
      }
      if ((faulted[chosen] || 0) >= startedAt - 1) {
        out.textContent = `The cluster is recovering — it lost a process serving ${chosen} during this reply and ` +
          "serves again" + (models.includes(chosen) ? " now" : " in seconds") + ": Retry.";
        break;
      }
      if (look === 7) {
        out.textContent = `The reply failed: ${message}`;
        break;
      }
      await new Promise((done) => setTimeout(done, 500));
    }
    const retry = document.createElement("button");
    retry.type = "button";
    retry.className = "retry";
    retry.textContent = "Retry";
    retry.addEventListener("click", () => {
      if (running) return;
      reply.previousElementSibling?.remove();  // the failed turn's own bubble: it is asked again
      reply.remove();
      box.value = text;
      form.requestSubmit();
    });
    reply.querySelector(".stats").replaceChildren(retry);
  }

  function bubble(role, text) {
    if (empty) empty.remove();
    const div = document.createElement("div");
    div.className = "msg " + role;
    div.innerHTML = '<div class="who small"></div><div class="text"></div><div class="tool-calls" hidden></div>' +
      '<div class="progress small muted"></div><div class="stats small muted"></div>';
    div.querySelector(".who").textContent = role === "user" ? "You" : select.value;
    div.querySelector(".text").textContent = text;
    log.appendChild(div);
    log.scrollTop = log.scrollHeight;
    return div;
  }

  // Tool calls arrive as OpenAI `tool_calls`: whole in `message`, or in pieces in `delta`
  // (by index: the first piece has the id and name, later ones add to the arguments).
  function mergeToolCalls(calls, pieces) {
    for (const piece of pieces || []) {
      const at = piece.index ?? calls.length;
      const call = calls[at] || (calls[at] = { id: "", type: "function", function: { name: "", arguments: "" } });
      if (piece.id) call.id = piece.id;
      if (piece.function?.name) call.function.name += piece.function.name;
      if (piece.function?.arguments) call.function.arguments += piece.function.arguments;
    }
    return calls;
  }
  function showToolCalls(reply, calls) {
    const block = reply.querySelector(".tool-calls");
    block.hidden = calls.length === 0;
    block.replaceChildren(...calls.filter(Boolean).map((call) => {
      const item = document.createElement("div");
      item.className = "tool-call";
      item.innerHTML = '<div class="small"><span class="badge cluster">Tool call</span> <code class="tool-name"></code></div>' +
        '<pre class="tool-args"></pre>';
      item.querySelector(".tool-name").textContent = call.function.name || "(unnamed)";
      let args = call.function.arguments;
      try { args = JSON.stringify(JSON.parse(args), null, 2); } catch (err) { /* still streaming, or not JSON */ }
      item.querySelector(".tool-args").textContent = args;
      return item;
    }));
  }

  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const text = box.value.trim();
    if (!text || running) return;
    if (!select.value) { noModel.hidden = false; return; }
    chosen = select.value;
    gone.hidden = true;
    const limit = Number(maxTokens.value);
    if (!Number.isInteger(limit) || limit < 1 || limit > 32768) {
      maxTokens.setCustomValidity("Max tokens: a whole number between 1 and 32768");
      maxTokens.reportValidity();
      return;
    }
    maxTokens.setCustomValidity("");
    box.value = "";
    send.disabled = true;
    stop.hidden = false;
    running = new AbortController();
    history.push({ role: "user", content: text });
    bubble("user", text);
    const reply = bubble("assistant", "");
    reply.classList.add("streaming");
    const out = reply.querySelector(".text");
    const stats = reply.querySelector(".stats");  // only the final measurement goes here
    const progress = reply.querySelector(".progress");
    progress.textContent = "waiting for the first token…";
    waiting = progress;
    const started = performance.now();
    const startedAt = Date.now() / 1000;  // wall clock, as the dashboard's fault times
    let first = null, tokens = 0, answer = "", calls = [], failed = null;
    try {
      const r = await fetch(form.dataset.sendUrl, {
        method: "POST", signal: running.signal,
        headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf },
        body: JSON.stringify({ model: select.value, messages: history, max_tokens: limit, temperature: 0 }),
      });
      if (!r.ok) {
        const message = (await r.json().catch(() => ({}))).error?.message || r.statusText;
        if (r.status === 404) loadModels();  // the model went away: the picker says so
        throw new Error(message);
      }
      const reader = r.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "", complete = false;
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const line = buffer.slice(0, cut).trim();
          buffer = buffer.slice(cut + 2);
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") { complete = true; continue; }
          const event = JSON.parse(data);
          if (event.error) throw new Error(event.error.message);
          const choice = event.choices?.[0] || {};
          const pieces = choice.delta?.tool_calls || choice.message?.tool_calls;
          if (pieces) showToolCalls(reply, mergeToolCalls(calls, pieces));
          const piece = choice.delta?.content || choice.message?.content || "";
          if (piece || pieces) {
            if (first === null) first = performance.now();
            tokens += 1;
          }
          if ((piece || pieces) && progress.dataset.paused) {  // resumed after a recovery: say it paused
            delete progress.dataset.paused;
            const note = document.createElement("div");
            note.className = "small muted pause-note";
            note.textContent = "The cluster recovered from a failure during this reply; the reply waited and resumed.";
            reply.insertBefore(note, stats);
          }
          if (piece) {
            answer += piece;
            out.textContent = answer;
          }
          progress.textContent = `${tokens} tokens…`;
          log.scrollTop = log.scrollHeight;
        }
      }
      // a stream cut off without its end (the router or the coordinator went away) is no answer
      if (!complete) throw new Error("the stream ended before the reply was complete");
      finish(reply, stats, started, first, tokens, answer, calls, "");
    } catch (err) {
      if (err.name === "AbortError") {  // Stop: the partial answer stays, and is said to be partial
        finish(reply, stats, started, first, tokens, answer, calls, "stopped · ");
        reply.classList.add("stopped");
      } else {
        history.pop();  // the turn failed: do not send it again as context
        reply.classList.add("error");
        failed = err.message;
      }
    } finally {
      waiting = null;
      progress.remove();
      reply.classList.remove("streaming");
      send.disabled = false;
      stop.hidden = true;
      running = null;
      box.focus();
    }
    if (failed !== null) await explainFailure(reply, out, text, failed, startedAt);
  });

  function finish(reply, stats, started, first, tokens, answer, calls, prefix) {
    const turn = { role: "assistant", content: answer };
    if (calls.length) turn.tool_calls = calls.filter(Boolean);
    history.push(turn);
    const seconds = (performance.now() - (first ?? started)) / 1000;
    const rate = tokens > 1 && seconds > 0 ? ((tokens - 1) / seconds).toFixed(1) : "–";
    const ttft = first === null ? "–" : Math.round(first - started) + " ms";
    stats.textContent = `${prefix}${rate} tokens/s · time to first token ${ttft} · ${tokens} token${tokens === 1 ? "" : "s"}`;
    stats.dataset.tokensPerSecond = rate;
  }

  stop.addEventListener("click", () => running?.abort());
  select.addEventListener("change", () => { chosen = select.value; gone.hidden = true; });
  box.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); form.requestSubmit(); }
  });
  document.getElementById("chat-clear").addEventListener("click", () => {
    running?.abort();
    history = [];
    log.replaceChildren();
    box.focus();
  });
  // a push says the served models may have changed (components/chat_models.html)
  document.body.addEventListener("htmx:oobAfterSwap", (e) => { if (e.detail.target?.id === "chat-models") loadModels(); });
  document.body.addEventListener("htmx:wsOpen", loadModels);  // after a reconnect, what changed meanwhile
  loadModels();
})();
