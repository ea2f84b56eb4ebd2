// Playground: chat with a deployment and watch the answer stream, with the request's time
// to first token and usage.

import { clear, cliHint, field, fmtInt, fmtMs, h, numberOrNull } from "../dom.js";

function statsList() {
  const values = {};
  const items = [
    ["ttft", "Time to first token"],
    ["total", "Total time"],
    ["speed", "Output speed"],
    ["prompt", "Prompt tokens"],
    ["completion", "Completion tokens"],
    ["finish", "Finish reason"],
    ["request", "Request id"],
  ];
  const dl = h(
    "dl",
    { class: "stats-list" },
    items.map(([key, label]) => {
      values[key] = h("dd", { dataset: { stat: key } }, "—");
      return h("div", {}, h("dt", {}, label), values[key]);
    }),
  );
  return {
    el: dl,
    set(key, value) {
      values[key].textContent = value;
    },
    reset() {
      for (const dd of Object.values(values)) dd.textContent = "—";
    },
  };
}

function bubble(role, text) {
  const body = h("div", { class: "bubble-text" }, text);
  const el = h(
    "li",
    { class: `bubble ${role}`, dataset: { role } },
    h("span", { class: "bubble-role" }, role === "user" ? "You" : "Assistant"),
    body,
  );
  return { el, body };
}

async function streamAnswer(ctx, request, parts) {
  const { answer, stats, stop } = parts;
  const controller = new AbortController();
  const abort = () => controller.abort();
  ctx.signal.addEventListener("abort", abort);
  stop.onclick = abort;
  const started = performance.now();
  let firstAt = null;
  let chunks = 0;
  let text = "";
  let finish = null;
  try {
    for await (const chunk of ctx.api.streamChat(request, controller.signal)) {
      if (chunk.requestId !== undefined) {
        stats.set("request", chunk.requestId || "—");
        continue;
      }
      const choice = chunk.choices?.[0];
      const delta = choice?.delta?.content || "";
      if (delta) {
        if (firstAt === null) {
          firstAt = performance.now();
          stats.set("ttft", fmtMs(firstAt - started));
        }
        chunks += 1;
        text += delta;
        answer.body.textContent = text;
        answer.el.dataset.chunks = String(chunks);
      }
      if (choice?.finish_reason) finish = choice.finish_reason;
      if (chunk.usage) {
        const elapsed = performance.now() - started;
        stats.set("total", fmtMs(elapsed));
        stats.set("prompt", fmtInt(chunk.usage.prompt_tokens));
        stats.set("completion", fmtInt(chunk.usage.completion_tokens));
        const genS = (performance.now() - (firstAt ?? started)) / 1000;
        if (genS > 0)
          stats.set("speed", `${(chunk.usage.completion_tokens / genS).toFixed(1)} tokens/s`);
      }
    }
    stats.set("finish", finish || "—");
    answer.el.dataset.state = "done";
  } catch (error) {
    if (error.name !== "AbortError") throw error;
    stats.set("finish", "stopped");
    answer.el.dataset.state = "stopped";
  } finally {
    ctx.signal.removeEventListener("abort", abort);
  }
  return text;
}

async function loadModels(ctx) {
  const body = await ctx.api.get("/v1/models", { signal: ctx.signal });
  return body.data.map((m) => m.id).sort();
}

export async function render(ctx) {
  ctx.setTitle("Playground");
  ctx.main.append(h("div", { class: "view-head" }, h("h1", {}, "Playground")));
  const models = await loadModels(ctx);
  if (!models.length) {
    ctx.main.append(
      h(
        "div",
        { class: "card empty-state" },
        h("p", {}, "No models are deployed yet."),
        ctx.session.role === "admin"
          ? h("a", { class: "button primary", href: "#/deploy" }, "Deploy a model")
          : null,
      ),
    );
    return;
  }
  const chosen = models.includes(ctx.params[0]) ? ctx.params[0] : models[0];
  const modelField = field({
    label: "Model",
    param: "model",
    options: models.map((m) => ({ value: m, label: m })),
    value: chosen,
  });
  const systemField = field({
    label: "System prompt (optional)",
    param: "system",
    textarea: true,
    rows: "2",
  });
  const tempField = field({
    label: "Temperature",
    param: "temperature",
    type: "number",
    value: "0.7",
    min: "0",
    max: "2",
    step: "0.1",
  });
  const maxField = field({
    label: "Max tokens",
    param: "max_tokens",
    type: "number",
    value: "256",
    min: "1",
    step: "1",
  });
  const messageField = field({
    label: "Message",
    param: "message",
    textarea: true,
    rows: "3",
    hint: "Ctrl+Enter sends.",
  });
  const input = messageField.querySelector("textarea");
  const transcript = h("ol", {
    class: "transcript",
    "aria-label": "Conversation",
    "aria-live": "polite",
  });
  const error = h("p", { class: "form-error", role: "alert" });
  const send = h("button", { type: "submit", class: "button primary" }, "Send");
  const stop = h("button", { type: "button", class: "button", disabled: true }, "Stop");
  const reset = h("button", { type: "button", class: "button quiet" }, "Clear conversation");
  const stats = statsList();
  const history = [];

  const form = h(
    "form",
    { class: "chat-form", novalidate: true, "aria-label": "Send a message" },
    messageField,
    error,
    h("div", { class: "actions" }, send, stop, reset),
  );
  const hint = h("div", {}, cliHint(`ebb chat ${chosen} "What is the capital of France?"`));
  const select = modelField.querySelector("select");
  select.addEventListener("change", () =>
    clear(hint, cliHint(`ebb chat ${select.value} "What is the capital of France?"`)),
  );
  ctx.main.append(
    h(
      "div",
      { class: "playground" },
      h("section", { class: "card chat", "aria-label": "Chat" }, transcript, form),
      h(
        "aside",
        { class: "card settings", "aria-label": "Settings and last request" },
        modelField,
        systemField,
        h("div", { class: "grid two" }, tempField, maxField),
        h("h2", {}, "Last request"),
        stats.el,
      ),
    ),
    hint,
  );
  reset.addEventListener("click", () => {
    history.length = 0;
    clear(transcript);
    stats.reset();
    input.focus();
  });
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) form.requestSubmit();
  });
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const text = input.value.trim();
    error.textContent = "";
    if (!text) {
      error.textContent = "Write a message first.";
      input.focus();
      return;
    }
    const system = systemField.querySelector("textarea").value.trim();
    const turn = [...history, { role: "user", content: text }];
    const request = {
      model: select.value,
      messages: system ? [{ role: "system", content: system }, ...turn] : turn,
      temperature: numberOrNull(tempField.querySelector("input")) ?? 0.7,
      max_tokens: numberOrNull(maxField.querySelector("input")) ?? 256,
      stream_options: { include_usage: true },
    };
    const question = bubble("user", text);
    const answer = bubble("assistant", "");
    answer.el.dataset.state = "streaming";
    transcript.append(question.el, answer.el);
    input.value = "";
    stats.reset();
    send.disabled = true;
    stop.disabled = false;
    transcript.setAttribute("aria-busy", "true");
    try {
      const reply = await streamAnswer(ctx, request, { answer, stats, stop });
      history.push({ role: "user", content: text }, { role: "assistant", content: reply });
    } catch (e) {
      answer.el.dataset.state = "failed";
      answer.body.textContent = "No answer.";
      const retry = e.retryAfterS ? ` Retry in ${e.retryAfterS} s.` : "";
      error.textContent = `${e.status ? `Error ${e.status}: ` : ""}${e.message}${retry}`;
      input.value = text; // nothing was lost: the message is back in the box
    } finally {
      send.disabled = false;
      stop.disabled = true;
      transcript.removeAttribute("aria-busy");
      answer.el.scrollIntoView({ block: "nearest" });
    }
  });
  input.focus();
}
