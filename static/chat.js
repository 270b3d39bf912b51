// Chat: fill the Model picker from the router, stream replies, and measure them.
(function () {
  const select = document.getElementById("chat-model");
  const log = document.getElementById("chat-log");
  const form = document.getElementById("chat-form");
  const box = document.getElementById("chat-message");
  const send = document.getElementById("chat-send");
  const empty = document.getElementById("chat-empty");
  const noModel = document.getElementById("chat-no-model");
  const csrf = document.querySelector('meta[name="csrf-token"]').content;
  let history = [];

  async function loadModels() {
    let models = [];
    try {
      const r = await fetch(select.dataset.modelsUrl);
      models = (await r.json()).models || [];
    } catch (err) { /* shown as "no model" below */ }
    const current = select.value;
    select.innerHTML = models.length ? "" : '<option value="">no model is being served</option>';
    for (const id of models) select.add(new Option(id, id, false, id === current));
    noModel.hidden = models.length > 0;
  }

  function bubble(role, text) {
    if (empty) empty.remove();
    const div = document.createElement("div");
    div.className = "msg " + role;
    div.innerHTML = '<div class="who small"></div><div class="text"></div><div class="progress small muted"></div><div class="stats small muted"></div>';
    div.querySelector(".who").textContent = role === "user" ? "You" : select.value;
    div.querySelector(".text").textContent = text;
    log.appendChild(div);
    log.scrollTop = log.scrollHeight;
    return div;
  }

  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const text = box.value.trim();
    if (!text) return;
    if (!select.value) { noModel.hidden = false; return; }
    box.value = "";
    send.disabled = true;
    history.push({ role: "user", content: text });
    bubble("user", text);
    const reply = bubble("assistant", "");
    reply.classList.add("streaming");
    const out = reply.querySelector(".text");
    const stats = reply.querySelector(".stats");  // only the final measurement goes here
    const progress = reply.querySelector(".progress");
    progress.textContent = "waiting for the first token…";
    const started = performance.now();
    let first = null, tokens = 0, answer = "";
    try {
      const r = await fetch(form.dataset.sendUrl, {
        method: "POST",
        headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf },
        body: JSON.stringify({ model: select.value, messages: history, max_tokens: 256, temperature: 0 }),
      });
      if (!r.ok) throw new Error((await r.json().catch(() => ({}))).error?.message || r.statusText);
      const reader = r.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
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
          if (data === "[DONE]") continue;
          const event = JSON.parse(data);
          if (event.error) throw new Error(event.error.message);
          const piece = event.choices?.[0]?.delta?.content || "";
          if (piece) {
            if (first === null) first = performance.now();
            tokens += 1;
            answer += piece;
            out.textContent = answer;
            progress.textContent = `${tokens} tokens…`;
            log.scrollTop = log.scrollHeight;
          }
        }
      }
      history.push({ role: "assistant", content: answer });
      const seconds = (performance.now() - (first ?? started)) / 1000;
      const rate = tokens > 1 && seconds > 0 ? ((tokens - 1) / seconds).toFixed(1) : "–";
      const ttft = first === null ? "–" : Math.round(first - started) + " ms";
      stats.textContent = `${rate} tokens/s · time to first token ${ttft} · ${tokens} tokens`;
      stats.dataset.tokensPerSecond = rate;
    } catch (err) {
      history.pop();  // the turn failed: do not send it again as context
      reply.classList.add("error");
      out.textContent = "Error: " + err.message;
    } finally {
      progress.remove();
      reply.classList.remove("streaming");
      send.disabled = false;
      box.focus();
    }
  });

  box.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); form.requestSubmit(); }
  });
  document.getElementById("chat-refresh").addEventListener("click", loadModels);
  document.getElementById("chat-clear").addEventListener("click", () => {
    history = [];
    log.replaceChildren();
    box.focus();
  });
  loadModels();
})();
