// Deploy a model: the form, then the weight prefetch and the first cold start as they happen
// (a LoRA adapter has neither: it loads into its base's runner on its first request).

import { fetchSchema } from "../api.js";
import {
  clear,
  clearErrors,
  cliHint,
  field,
  fmtMs,
  formError,
  h,
  showFieldError,
  showFormError,
} from "../dom.js";
import {
  envFieldset,
  limitsFieldset,
  moreFieldset,
  readOptions,
  servingFieldset,
} from "../deploy_options.js";
import { engineFieldset, readEngine } from "../engine.js";
import { progressBar, weightsProgress } from "../model.js";
import { priceFields, priceFieldset, readPrices } from "../prices.js";
import { readScaling, scalingFields } from "../scaling.js";

const NAME_PATTERN = /^[a-z0-9][a-z0-9._-]{0,62}$/;

function readForm(form, prices) {
  const value = (param) => form.querySelector(`[data-param="${param}"]`);
  const body = {
    name: value("name").value.trim(),
    source: value("source").value.trim(),
    ...readScaling(form),
  };
  const base = value("base").value.trim();
  if (base) body.base = base;
  readPrices(form, prices, body);
  readEngine(form, body);
  readOptions(form, body);
  return body;
}

/** Checks the browser can do without a round trip; the platform checks the rest. */
function checkLocally(form, body) {
  let ok = true;
  if (!NAME_PATTERN.test(body.name)) {
    showFieldError(
      form,
      "name",
      "Use lowercase letters, digits, '.', '_' or '-', starting with a letter or digit (at most 63).",
    );
    ok = false;
  }
  if (!body.source) {
    showFieldError(
      form,
      "source",
      body.base
        ? "Enter the PEFT adapter directory: a local directory, s3:// or hf://."
        : "Enter where the weights come from, e.g. gguf:PACKAGE/FILE.gguf or a local directory.",
    );
    ok = false;
  }
  for (const [param, v] of Object.entries(body)) {
    if (typeof v === "number" && Number.isNaN(v)) {
      showFieldError(form, param, "Enter a number.");
      ok = false;
    }
  }
  if (!ok) form.querySelector("[aria-invalid]")?.focus();
  return ok;
}

// `ebb deploy` flags by API field: the hint after a deploy is the same deployment as a command.
const FLAGS = {
  base: "--base",
  min_replicas: "--min",
  max_replicas: "--max",
  idle_timeout_s: "--idle-timeout",
  max_concurrency: "--max-concurrency",
  queue_depth_limit: "--queue-depth-limit",
  admission_timeout_s: "--admission-timeout",
  max_model_len: "--max-model-len",
  owner: "--owner",
  visibility: "--visibility",
  "engine.dtype": "--dtype",
  "engine.quantization": "--quantization",
  "engine.max_num_seqs": "--max-num-seqs",
  "engine.tensor_parallel_size": "--tp",
  "engine.gpu_memory_gib": "--gpu-memory-gib",
  "serving.tool_parser": "--tool-parser",
  "serving.task": "--task",
  "serving.batch_discount_pct": "--batch-discount",
  "serving.default_max_tokens": "--default-max-tokens",
  "serving.max_tokens_limit": "--max-tokens-limit",
  "serving.max_request_s": "--max-request-s",
};
const SWITCH_FLAGS = {
  "engine.enable_prefix_caching": ["--prefix-caching", "--no-prefix-caching"],
  "engine.enforce_eager": ["--enforce-eager", "--cuda-graphs"],
};
const PRICE_FLAGS = {
  price_per_1m_input_tokens_micros: "--input-price",
  price_per_1m_output_tokens_micros: "--output-price",
  price_per_gpu_second_micros: "--gpu-second-price",
};

function quoted(value) {
  const text = String(value);
  return /^[\w@%+=:,./-]+$/.test(text) ? text : `'${text.replaceAll("'", "'\\''")}'`;
}

function cliCommand(body) {
  const parts = ["ebb deploy", body.name, "--source", quoted(body.source)];
  const flat = { ...body };
  for (const group of ["engine", "serving"]) {
    for (const [k, v] of Object.entries(body[group] || {})) flat[`${group}.${k}`] = v;
  }
  for (const [param, value] of Object.entries(flat)) {
    if (FLAGS[param]) parts.push(FLAGS[param], quoted(value));
    else if (SWITCH_FLAGS[param]) parts.push(SWITCH_FLAGS[param][value ? 0 : 1]);
    else if (PRICE_FLAGS[param]) parts.push(PRICE_FLAGS[param], String(value / 1e6));
    else if (param === "shared_with") for (const t of value) parts.push("--share-with", quoted(t));
    else if (param === "serving.chat_template") parts.push("--chat-template-file", "TEMPLATE.jinja");
  }
  return parts.join(" ");
}

export async function render(ctx) {
  ctx.setTitle("Deploy a model");
  const head = h("div", { class: "view-head" }, h("h1", {}, "Deploy a model"));
  const area = h("div", { class: "view-body" });
  ctx.main.append(head, area);
  const [schema, list] = await Promise.all([
    fetchSchema(ctx.session.key),
    ctx.api.get("/v1/deployments", { signal: ctx.signal }).catch(() => ({ data: [] })),
  ]);
  const prices = priceFields(schema);
  const sources = [...new Set(list.data.map((d) => d.source).filter(Boolean))];
  const datalist = h(
    "datalist",
    { id: "known-sources" },
    sources.map((src) => h("option", { value: src })),
  );
  // An adapter's base is a model, never another adapter.
  const bases = h(
    "datalist",
    { id: "known-bases" },
    list.data.filter((d) => !d.base).map((d) => h("option", { value: d.name })),
  );
  const submit = h("button", { type: "submit", class: "button primary" }, "Deploy");
  const form = h(
    "form",
    { class: "card", novalidate: true, "aria-label": "Deploy a model" },
    h(
      "div",
      { class: "grid" },
      field({
        label: "Name",
        param: "name",
        required: true,
        autocomplete: "off",
        spellcheck: "false",
        hint: "The model name clients call; lowercase letters, digits, '.', '_' or '-'.",
      }),
      field({
        label: "Source",
        param: "source",
        required: true,
        list: "known-sources",
        autocomplete: "off",
        spellcheck: "false",
        hint: "Where the weights come from: gguf:PACKAGE/FILE.gguf, a local directory, …",
      }),
      field({
        label: "Base deployment",
        param: "base",
        list: "known-bases",
        autocomplete: "off",
        spellcheck: "false",
        hint:
          "Optional. Makes this a LoRA adapter of that deployment (one with LoRA on): " +
          "Source is then the PEFT adapter directory, and the base's runners serve it.",
      }),
    ),
    datalist,
    bases,
    h(
      "fieldset",
      {},
      h("legend", {}, "Scaling"),
      scalingFields({ min_replicas: 0, max_replicas: 1, idle_timeout_s: 60 }),
    ),
    limitsFieldset(),
    priceFieldset(prices),
    engineFieldset(),
    servingFieldset(),
    envFieldset(),
    formError(),
    h("div", { class: "actions" }, submit),
  );
  // Whatever else the API takes (a field newer than this form) is offered too.
  const more = moreFieldset(schema, form);
  if (more) form.querySelector(".form-error").before(more);
  clear(area, form, cliHint("ebb deploy NAME --source SOURCE --min 0 --max 1 --idle-timeout 60"));

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clearErrors(form);
    const body = readForm(form, prices);
    if (!checkLocally(form, body)) return;
    submit.disabled = true;
    submit.textContent = "Deploying…";
    try {
      const created = await ctx.api.post("/v1/deployments", body, { signal: ctx.signal });
      const base = created.base || body.base;
      clear(area, progressPanel(ctx, created, base), cliHint(cliCommand(body)));
    } catch (error) {
      if (error.name === "AbortError") return;
      showFormError(form, error);
      submit.disabled = false;
      submit.textContent = "Deploy";
    }
  });
}

function step(name, title) {
  const status = h("span", { class: "step-status", "aria-live": "polite" });
  const text = h("div", { class: "step-text" });
  const el = h(
    "li",
    { class: "step", dataset: { step: name, state: "pending" } },
    h("div", { class: "step-title" }, title, status),
    text,
  );
  return {
    el,
    set(state, label, ...content) {
      el.dataset.state = state;
      if (status.textContent !== label) status.textContent = label; // announce changes only
      clear(text, ...content);
    },
  };
}

function weightsStep(s, d) {
  if (d.weights === "preparing") {
    const value = weightsProgress(d);
    s.set(
      "active",
      value === null ? "preparing" : `${Math.round(value * 100)}%`,
      h("p", {}, "Fetching and verifying the weights into the local cache."),
      progressBar(value, "Weight prefetch progress"),
    );
  } else if (d.weights === "failed") {
    s.set(
      "failed",
      "failed",
      h("p", { class: "error" }, d.error || "Preparing the weights failed."),
    );
  } else if (d.weights === "ready") {
    s.set(
      "done",
      "in the cache",
      h("p", {}, "The first cold start loads from the local cache; nothing to download."),
    );
  } else {
    s.set("done", "nothing to fetch", h("p", {}, "This source needs no prefetch."));
  }
}

function coldStartStep(s, d, seen) {
  const runners = [...(d.runners || [])].sort((a, b) => b.launched_ms - a.launched_ms);
  const live = runners.find((r) => r.state === "ready") || runners[0];
  if (!live) {
    s.set(
      d.min_replicas > 0 ? "active" : "waiting",
      d.min_replicas > 0 ? "starting" : "on first request",
      h(
        "p",
        {},
        d.min_replicas > 0
          ? "A runner is being started."
          : "Scaled to zero: the first request starts a runner.",
      ),
    );
    return;
  }
  if (!seen.has(live.id)) seen.set(live.id, Date.now());
  const tierTimes = d.cold_start_ms?.[live.tier];
  if (live.state === "ready") {
    const total =
      tierTimes?.total ??
      (live.ready_ms && live.launched_ms ? live.ready_ms - live.launched_ms : null);
    const phases = Object.entries(tierTimes || {})
      .filter(([k]) => k !== "total")
      .map(([k, v]) => `${k} ${fmtMs(v)}`)
      .join(" · ");
    s.set(
      "done",
      "ready",
      h(
        "p",
        {},
        `Runner ${live.id} is ready via ${live.tier.replaceAll("_", " ")} in ${fmtMs(total)}.`,
      ),
      phases ? h("p", { class: "hint" }, phases) : null,
    );
  } else if (live.state === "failed" || live.state === "exited") {
    s.set(
      "failed",
      live.state,
      h(
        "p",
        { class: "error" },
        live.error || d.error || "The runner stopped before it was ready.",
      ),
      d.error_log ? h("pre", { class: "log" }, d.error_log) : null,
    );
  } else {
    s.set(
      "active",
      live.state,
      h("p", {}, `Runner ${live.id} is ${live.state} (${fmtMs(Date.now() - seen.get(live.id))}).`),
      progressBar(null, "Cold start progress"),
    );
  }
}

/** An adapter has no weights to prefetch nor runners to start: its base's runner loads it. */
function adapterStep(s, base, d) {
  if (d?.error) {
    s.set("failed", "failing", h("p", { class: "error" }, d.error));
    return;
  }
  s.set(
    "waiting",
    "on first request",
    h(
      "p",
      {},
      "Registered as a LoRA adapter of ",
      h("code", {}, base),
      `: it loads into ${base}'s runner on its first request (a base at zero is woken by it), ` +
        "with no weights or cold start of its own.",
    ),
  );
}

function progressPanel(ctx, created, base) {
  const name = created.name;
  const version = created.deployed_version;
  const createdStep = step("created", version > 1 ? "Version created" : "Deployment created");
  createdStep.set(
    "done",
    version > 1 ? `version ${version}` : "done",
    version > 1
      ? h(
          "p",
          {},
          `A new version (v${version}) of ${name}: it takes no traffic until you roll it out from the deployment's Versions panel.`,
        )
      : h("p", {}, "Clients call it as model ", h("code", {}, name), "."),
  );
  const weights = step("weights", "Weights prefetch");
  const cold = step("cold-start", "First cold start");
  const adapter = step("adapter", `Served by ${base}`);
  const seen = new Map();
  const title = h(
    "h2",
    { id: "deploy-progress-title" },
    base ? `${name} is registered` : `Deploying ${name}`,
  );
  const panel = h(
    "section",
    { class: "card", "aria-labelledby": "deploy-progress-title" },
    title,
    h("ol", { class: "steps" }, createdStep.el, ...(base ? [adapter.el] : [weights.el, cold.el])),
    h(
      "div",
      { class: "actions" },
      h(
        "a",
        { class: "button", href: `#/deployments/${encodeURIComponent(name)}` },
        "Open deployment",
      ),
      h(
        "a",
        { class: "button", href: `#/playground/${encodeURIComponent(name)}` },
        "Try it in the playground",
      ),
    ),
  );
  if (base) adapterStep(adapter, base, created);
  ctx.every(1000, async () => {
    const d = await ctx.api.get(`/v1/deployments/${encodeURIComponent(name)}`, {
      signal: ctx.signal,
    });
    if (base) {
      adapterStep(adapter, base, d);
      return;
    }
    weightsStep(weights, d);
    coldStartStep(cold, d, seen);
    title.textContent = d.status === "ready" ? `${name} is ready` : `Deploying ${name}`;
  });
  return panel;
}
