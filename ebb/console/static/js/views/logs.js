// Logs: follow the platform's, a deployment's or one runner's log lines live (the admin);
// a tenant follows the runners of its own deployments.
// GET /v1/logs answers the last lines and a cursor; each poll passes the cursor back and
// gets only the lines written since, so following costs one small request a second.

import { cliHint, field, h } from "../dom.js";

const FOLLOW_MS = 1000;
const FIRST_TAIL = 200;
// The page keeps this many lines; older ones leave the screen (the files keep them).
const MAX_LINES = 2000;

/** "logs", "logs/NAME" or "logs/NAME/RUNNER" <-> {deployment, runner}. */
function sourceOf(params) {
  return { deployment: params[0] || "", runner: params[1] || "" };
}

function valueOf(source) {
  if (source.runner) return `runner:${source.deployment}/${source.runner}`;
  if (source.deployment) return `deployment:${source.deployment}`;
  return "platform";
}

function parseValue(value) {
  if (value.startsWith("runner:")) {
    const [deployment, runner] = value.slice(7).split("/");
    return { deployment, runner };
  }
  if (value.startsWith("deployment:")) return { deployment: value.slice(11), runner: "" };
  return { deployment: "", runner: "" };
}

function query(source) {
  if (source.runner) {
    // The deployment goes along: a tenant's key may read only its own deployments' runners.
    return `deployment=${encodeURIComponent(source.deployment)}&runner=${encodeURIComponent(source.runner)}`;
  }
  if (source.deployment) return `deployment=${encodeURIComponent(source.deployment)}`;
  return "";
}

function cliFor(source) {
  if (source.runner) return `ebb logs ${source.deployment} --runner ${source.runner} -f`;
  if (source.deployment) return `ebb logs ${source.deployment} -f`;
  return "ebb logs -f";
}

function hashFor(source) {
  const parts = [source.deployment, source.runner].filter(Boolean).map(encodeURIComponent);
  return `#/logs${parts.length ? `/${parts.join("/")}` : ""}`;
}

async function sourceOptions(ctx, chosen) {
  const admin = ctx.session.role === "admin";
  const list = await ctx.api.get("/v1/deployments", { signal: ctx.signal });
  const options = admin ? [{ value: "platform", label: "Platform processes" }] : [];
  // A tenant sees whole (source included) only the deployments it owns: their logs.
  for (const d of list.data.filter((x) => admin || x.source !== undefined)) {
    options.push({ value: `deployment:${d.name}`, label: `Deployment ${d.name} (all runners)` });
    for (const r of d.runners || []) {
      options.push({
        value: `runner:${d.name}/${r.id}`,
        label: `Runner ${r.id} of ${d.name} (${r.state})`,
      });
    }
  }
  // A runner that has exited is gone from the list, yet its log can still be read.
  const value = valueOf(chosen);
  const known = options.some((o) => o.value === value);
  if (!known && (admin || chosen.deployment)) options.push({ value, label: value });
  return options;
}

export async function render(ctx) {
  const source = sourceOf(ctx.params);
  ctx.setTitle("Logs");
  const head = h("div", { class: "view-head" }, h("h1", {}, "Logs"));
  ctx.main.append(head);
  const options = await sourceOptions(ctx, source);
  if (!options.length) {
    ctx.main.append(
      h("p", { class: "muted", dataset: { logs: "none" } }, "You have no deployments whose logs to follow."),
    );
    return;
  }
  if (ctx.session.role !== "admin" && !source.deployment) {
    Object.assign(source, parseValue(options[0].value)); // a tenant has no platform logs
  }
  const sourceField = field({
    label: "Show",
    param: "source",
    options,
    value: valueOf(source),
  });
  const followField = h(
    "label",
    { class: "check" },
    h("input", { type: "checkbox", checked: true, name: "follow" }),
    " Follow new lines",
  );
  const follow = followField.querySelector("input");
  const state = h("p", { class: "live", role: "status", dataset: { logs: "loading" } }, "Loading…");
  const lines = h("pre", {
    class: "log log-tail",
    tabindex: "0",
    "aria-label": "Log lines",
    dataset: { lines: "0" },
  });
  const hint = h("div", {}, cliHint(cliFor(source)));
  ctx.main.append(
    h("div", { class: "card log-controls" }, h("div", { class: "grid two" }, sourceField, followField)),
    state,
    lines,
    hint,
  );
  sourceField.querySelector("select").addEventListener("change", (event) => {
    ctx.navigate(hashFor(parseValue(event.target.value)));
  });

  let cursor = null;
  let count = 0;
  const chunks = []; // lines per text node, oldest first, to drop the oldest past MAX_LINES
  const prefixed = !source.runner; // several files: say which one each line is from
  const append = (data) => {
    if (!data.length) return;
    const atBottom = lines.scrollTop + lines.clientHeight >= lines.scrollHeight - 4;
    const text = data.map((l) => (prefixed ? `[${l.source}] ${l.line}` : l.line)).join("\n");
    lines.append(document.createTextNode(`${count ? "\n" : ""}${text}`));
    chunks.push(data.length);
    count += data.length;
    while (chunks.length > 1 && count - chunks[0] >= MAX_LINES) {
      count -= chunks.shift();
      lines.firstChild.remove();
    }
    lines.dataset.lines = String(count);
    // Stay at the newest line unless the reader scrolled up to read an older one.
    if (atBottom) lines.scrollTop = lines.scrollHeight;
  };
  const base = `/v1/logs?${query(source)}`;
  await ctx.every(FOLLOW_MS, async () => {
    if (cursor !== null && !follow.checked) {
      state.textContent = `Paused · ${count} lines`;
      return;
    }
    const path = cursor === null ? `${base}&tail=${FIRST_TAIL}` : `${base}&cursor=${cursor}`;
    let body;
    try {
      body = await ctx.api.get(path, { signal: ctx.signal });
    } catch (error) {
      if (error.name === "AbortError") throw error;
      state.dataset.logs = "failed";
      state.textContent = error.message;
      return;
    }
    cursor = encodeURIComponent(body.cursor);
    append(body.data);
    state.dataset.logs = "following";
    state.textContent = `Following · ${count} lines · updated ${new Date().toLocaleTimeString("en-GB")}`;
  });
}
