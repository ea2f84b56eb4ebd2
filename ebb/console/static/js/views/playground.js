// Playground: chat with a deployment and watch the answer stream, with the request's time
// to first token and usage; offer it tools and see its tool calls. An embedding (pooling)
// deployment gets an embeddings playground instead.

import {
  clear,
  clearErrors,
  cliHint,
  field,
  fmtInt,
  fmtMs,
  h,
  numberOrNull,
  showFieldError,
} from "../dom.js";
import { embeddingsPlayground } from "../embeddings.js";

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

const ROLE_NAMES = { user: "You", assistant: "Assistant", tool: "Tool result" };

function bubble(role, text) {
  const body = h("div", { class: "bubble-text" }, text);
  const el = h(
    "li",
    { class: `bubble ${role}`, dataset: { role } },
    h("span", { class: "bubble-role" }, ROLE_NAMES[role] || role),
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
  const calls = []; // tool calls by index, assembled from their streamed deltas
  try {
    for await (const chunk of ctx.api.streamChat(request, controller.signal)) {
      if (chunk.requestId !== undefined) {
        stats.set("request", chunk.requestId || "—");
        continue;
      }
      const choice = chunk.choices?.[0];
      const delta = choice?.delta?.content || "";
      if (firstAt === null && (delta || choice?.delta?.tool_calls?.length)) {
        firstAt = performance.now(); // a tool call's first delta is the first token too
        stats.set("ttft", fmtMs(firstAt - started));
      }
      if (delta) {
        chunks += 1;
        text += delta;
        answer.body.textContent = text;
        answer.el.dataset.chunks = String(chunks);
      }
      for (const d of choice?.delta?.tool_calls || []) {
        const call = (calls[d.index ?? 0] ??= { id: "", type: "function", function: { name: "", arguments: "" } });
        if (d.id) call.id = d.id;
        if (d.function?.name) call.function.name += d.function.name;
        if (d.function?.arguments) call.function.arguments += d.function.arguments;
        showToolCalls(answer, calls);
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
  return { text, calls: calls.filter(Boolean) };
}

function showToolCalls(answer, calls) {
  let box = answer.el.querySelector(".tool-calls");
  if (!box) {
    box = h("ul", { class: "tool-calls", "aria-label": "Tool calls" });
    answer.el.append(box);
  }
  box.replaceChildren(
    ...calls.filter(Boolean).map((c) =>
      h(
        "li",
        { class: "tool-call", dataset: { tool: c.function.name, callId: c.id } },
        h("span", { class: "tool-call-name" }, `Tool call: ${c.function.name}`),
        h("pre", { class: "log" }, prettyArguments(c.function.arguments)),
      ),
    ),
  );
  answer.el.dataset.toolCalls = String(calls.filter(Boolean).length);
}

function prettyArguments(text) {
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text; // still streaming: not whole JSON yet
  }
}

// One line that reads as an example, not as content already in the box (a full,
// indented tool object as the placeholder looked like text waiting to be sent).
const TOOLS_PLACEHOLDER =
  'e.g. [{"type": "function", "function": {"name": "get_weather", "parameters": {…}}}]';

/** The tools textarea as a list, or an error message naming what to fix. */
function parseTools(text) {
  if (!text.trim()) return { tools: null };
  let tools;
  try {
    tools = JSON.parse(text);
  } catch (error) {
    return { error: `Tools must be JSON: ${error.message}` };
  }
  if (!Array.isArray(tools)) return { error: "Tools must be a JSON list of tool objects." };
  return { tools };
}

async function loadModels(ctx) {
  const body = await ctx.api.get("/v1/models", { signal: ctx.signal });
  return body.data.sort((a, b) => a.id.localeCompare(b.id));
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
  const ids = models.map((m) => m.id);
  const chosen = ids.includes(ctx.params[0]) ? ctx.params[0] : ids[0];
  const modelField = field({
    label: "Model",
    param: "model",
    options: ids.map((m) => ({ value: m, label: m })),
    value: chosen,
  });
  const select = modelField.querySelector("select");
  const area = h("div", {});
  ctx.main.append(area);
  const show = (first) => {
    const model = models.find((m) => m.id === select.value);
    const embed = model.capabilities?.embeddings === true;
    const mode = embed ? embeddingsPlayground(ctx, model.id) : chatPlayground(ctx, model);
    const command = embed
      ? `curl $EBB_URL/v1/embeddings -d '{"model": "${model.id}", "input": ["hello"]}'`
      : `ebb chat ${model.id} "What is the capital of France?"`;
    clear(
      area,
      h(
        "div",
        { class: "playground", dataset: { mode: embed ? "embeddings" : "chat" } },
        mode.panel,
        h(
          "aside",
          { class: "card settings", "aria-label": "Settings and last request" },
          modelField,
          mode.aside,
        ),
      ),
      cliHint(command),
    );
    if (first) mode.focus?.(); // later, focus stays on the model the user just chose
  };
  select.addEventListener("change", () => show(false));
  show(true);
}

function chatPlayground(ctx, model) {
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
  const toolsField = field({
    label: "Tools (JSON, optional)",
    param: "tools",
    textarea: true,
    rows: "4",
    spellcheck: "false",
    placeholder: TOOLS_PLACEHOLDER,
    hint: "OpenAI tool objects; the model may answer with tool calls.",
  });
  const choiceField = field({
    label: "Tool choice",
    param: "tool_choice",
    options: [
      { value: "auto", label: "auto: the model decides" },
      { value: "required", label: "required: it must call one" },
      { value: "none", label: "none: answer in words" },
    ],
    value: "auto",
  });
  const tools = model.capabilities?.tools !== false;
  const messageField = field({
    label: "Message",
    param: "message",
    textarea: true,
    rows: "3",
    hint: "Ctrl+Enter sends.",
  });
  const input = messageField.querySelector("textarea");
  const messageHint = messageField.querySelector(".hint");
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
  let pendingCall = null; // the tool call the next message answers, if the model made one

  const form = h(
    "form",
    { class: "chat-form", novalidate: true, "aria-label": "Send a message" },
    messageField,
    error,
    h("div", { class: "actions" }, send, stop, reset),
  );
  const awaitResult = (call) => {
    pendingCall = call;
    messageHint.textContent = call
      ? `Your next message is sent as the result of tool call ${call.function.name} (${call.id}).`
      : "Ctrl+Enter sends.";
  };
  reset.addEventListener("click", () => {
    history.length = 0;
    awaitResult(null);
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
    clearErrors(toolsField);
    if (!text) {
      error.textContent = "Write a message first.";
      input.focus();
      return;
    }
    const parsedTools = tools ? parseTools(toolsField.querySelector("textarea").value) : {};
    if (parsedTools.error) {
      showFieldError(toolsField, "tools", parsedTools.error);
      toolsField.querySelector("textarea").focus();
      return;
    }
    const system = systemField.querySelector("textarea").value.trim();
    const message = pendingCall
      ? { role: "tool", tool_call_id: pendingCall.id, content: text }
      : { role: "user", content: text };
    const turn = [...history, message];
    const request = {
      model: model.id,
      messages: system ? [{ role: "system", content: system }, ...turn] : turn,
      temperature: numberOrNull(tempField.querySelector("input")) ?? 0.7,
      max_tokens: numberOrNull(maxField.querySelector("input")) ?? 256,
      stream_options: { include_usage: true },
    };
    if (parsedTools.tools) {
      request.tools = parsedTools.tools;
      request.tool_choice = choiceField.querySelector("select").value;
    }
    const question = bubble(pendingCall ? "tool" : "user", text);
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
      const said = { role: "assistant", content: reply.text || null };
      if (reply.calls.length) said.tool_calls = reply.calls;
      history.push(message, said);
      awaitResult(reply.calls[0] || null);
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
  return {
    panel: h("section", { class: "card chat", "aria-label": "Chat" }, transcript, form),
    aside: [
      systemField,
      h("div", { class: "grid two" }, tempField, maxField),
      tools ? h("div", { class: "tools" }, toolsField, choiceField) : null,
      h("h2", {}, "Last request"),
      stats.el,
    ],
    focus: () => input.focus(),
  };
}
