// The deploy form's remaining options: serving (task, tool parser, chat template, batch
// discount), admission limits and the billed owner, and — read from the platform's own
// OpenAPI schema — any other field DeploymentCreate takes that the form has no field for
// yet, so everything the API accepts can be set here. Each field carries the API's name
// (`serving.task`, ...) so a 400 lands next to it; empty fields are left out of the body.

import { field, h } from "./dom.js";

const TOOL_PARSERS = ["", "none", "hermes", "llama3_json", "mistral"];

const LIMITS = [
  {
    param: "max_concurrency",
    label: "Max concurrency",
    kind: "int",
    hint: "Requests one runner serves at once.",
  },
  {
    param: "queue_depth_limit",
    label: "Queue depth limit",
    kind: "int",
    hint: "Queued requests before new ones get 429.",
  },
  {
    param: "admission_timeout_s",
    label: "Admission timeout (s)",
    kind: "number",
    hint: "How long a request may wait for a runner; empty: the platform's.",
  },
  {
    param: "owner",
    label: "Owner (tenant)",
    kind: "text",
    hint: "The tenant that owns it and is billed its GPU time; empty: the platform.",
  },
  {
    param: "visibility",
    label: "Visibility",
    kind: "choice",
    options: [
      { value: "", label: "platform default" },
      { value: "public", label: "public: every tenant may call it" },
      { value: "private", label: "private: its owner and the tenants shared with" },
    ],
  },
  {
    param: "shared_with",
    label: "Shared with (tenants)",
    kind: "list",
    hint: "Tenants that may call a private deployment, separated by commas.",
  },
];

const SERVING = [
  {
    param: "serving.task",
    label: "Task",
    kind: "choice",
    options: [
      { value: "", label: "generate (default)" },
      { value: "generate", label: "generate" },
      { value: "embed", label: "embed (pooling: /v1/embeddings)" },
    ],
  },
  {
    param: "serving.tool_parser",
    label: "Tool parser",
    kind: "choice",
    options: TOOL_PARSERS.map((p) => ({
      value: p,
      label: p === "" ? "from the chat template (default)" : p,
    })),
    hint: "How replies become tool calls.",
  },
  {
    param: "serving.batch_discount_pct",
    label: "Batch discount (%)",
    kind: "int",
    hint: "Batch API token prices: this much percent off.",
  },
  {
    param: "serving.default_max_tokens",
    label: "Default max tokens",
    kind: "int",
    hint: "Output tokens of a request that names no max_tokens; empty: 2048.",
  },
  {
    param: "serving.max_tokens_limit",
    label: "Max tokens limit",
    kind: "int",
    hint: "The most output tokens a request may ask for (a 400 above); 0 or empty: the context.",
  },
  {
    param: "serving.max_request_s",
    label: "Max request time (s)",
    kind: "number",
    hint: "Seconds a request may run before it is stopped; empty: 600, 0: no limit.",
  },
  {
    param: "serving.chat_template",
    label: "Chat template",
    kind: "text",
    textarea: true,
    hint: "A Jinja chat template instead of the model's own; empty: the model's.",
  },
];

const SWITCH = [
  { value: "", label: "platform default" },
  { value: "true", label: "on" },
  { value: "false", label: "off" },
];

function control(def) {
  const { kind, ...attrs } = def;
  if (kind === "int" || kind === "number") {
    Object.assign(attrs, { type: "number", min: "0", step: kind === "int" ? "1" : "any" });
  }
  if (kind === "bool") attrs.options = SWITCH;
  if (attrs.options) attrs.value = "";
  const el = field({ ...attrs, autocomplete: "off", spellcheck: "false" });
  el.querySelector("[data-param]").dataset.kind = kind;
  return el;
}

export function servingFieldset() {
  return h(
    "fieldset",
    { class: "serving" },
    h("legend", {}, "Serving"),
    h("div", { class: "grid three" }, SERVING.filter((d) => !d.textarea).map(control)),
    SERVING.filter((d) => d.textarea).map((d) => control({ ...d, rows: "3" })),
  );
}

/** The version's environment (secrets such as HF_TOKEN): sent once, stored sealed. */
export function envFieldset() {
  return h(
    "fieldset",
    { class: "env" },
    h("legend", {}, "Environment"),
    control({
      param: "env",
      label: "Environment variables",
      kind: "map",
      textarea: true,
      rows: "3",
      autocomplete: "off",
      hint: "One NAME=value a line: APP_<NAME> for your own variables, and the weights' credentials HF_TOKEN, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION. Stored encrypted; only the names are ever shown again. Empty: a new version keeps the latest one's.",
    }),
  );
}

export function limitsFieldset() {
  return h(
    "fieldset",
    { class: "admission" },
    h("legend", {}, "Admission, owner and sharing"),
    h("div", { class: "grid two" }, LIMITS.map(control)),
  );
}

// --- fields only the schema knows --------------------------------------------------------

function resolve(schema, prop) {
  const ref =
    prop.$ref || prop.allOf?.find((p) => p.$ref)?.$ref || prop.anyOf?.find((p) => p.$ref)?.$ref;
  return ref ? schema.components.schemas[ref.split("/").pop()] || prop : prop;
}

function leafKind(prop) {
  const typed = prop.type ? prop : (prop.anyOf || []).find((p) => p.type && p.type !== "null");
  if (!typed) return null;
  if (typed.enum) return { kind: "choice", options: typed.enum };
  if (typed.type === "integer") return { kind: "int" };
  if (typed.type === "number") return { kind: "number" };
  if (typed.type === "boolean") return { kind: "bool" };
  if (typed.type === "string") return { kind: "text" };
  if (typed.type === "array" && typed.items?.type === "string") return { kind: "list" };
  if (typed.type === "object" && typed.additionalProperties?.type === "string") {
    return { kind: "map" };
  }
  return null; // other shapes: not a form field (the CLI and API take them)
}

/** [param, prop] for each leaf of DeploymentCreate, one object level deep. */
export function schemaLeaves(schema) {
  const props = schema?.components?.schemas?.DeploymentCreate?.properties || {};
  const out = [];
  for (const [name, prop] of Object.entries(props)) {
    const target = resolve(schema, prop);
    if (target.properties) {
      for (const [sub, leaf] of Object.entries(target.properties)) out.push([`${name}.${sub}`, leaf]);
    } else out.push([name, prop]);
  }
  return out;
}

function title(param) {
  const words = param.split(".").pop().replaceAll("_", " ");
  return words.charAt(0).toUpperCase() + words.slice(1);
}

/** A fieldset for the leaves the form has no field for (null when there are none). */
export function moreFieldset(schema, form) {
  const missing = schemaLeaves(schema).filter(
    ([param]) => !form.querySelector(`[data-param="${CSS.escape(param)}"]`),
  );
  const controls = [];
  for (const [param, prop] of missing) {
    const leaf = leafKind(prop);
    if (!leaf) continue;
    const options = leaf.options
      ? [{ value: "", label: "platform default" }, ...leaf.options.map((o) => ({ value: String(o), label: String(o) }))]
      : undefined;
    const shape = {
      list: { hint: `${prop.description || ""} Separate values with commas.` },
      map: { textarea: true, rows: "3", hint: `${prop.description || ""} One NAME=value a line.` },
    }[leaf.kind];
    controls.push(
      control({
        param,
        label: title(param),
        hint: prop.description,
        kind: leaf.kind,
        options,
        ...shape,
      }),
    );
  }
  if (!controls.length) return null;
  return h(
    "fieldset",
    { class: "more" },
    h("legend", {}, "More options"),
    h("div", { class: "grid three" }, controls),
  );
}

/** Adds every filled-in option field (those with a data-kind) to `body`, nesting on ".". */
export function readOptions(form, body) {
  for (const el of form.querySelectorAll("[data-kind]")) {
    const text = el.value.trim();
    if (text === "") continue;
    const kind = el.dataset.kind;
    let value = text;
    if (kind === "int" || kind === "number") value = Number(text);
    else if (kind === "bool") value = text === "true";
    else if (kind === "list") {
      value = text
        .split(",")
        .map((v) => v.trim())
        .filter(Boolean);
    } else if (kind === "map") {
      value = {};
      for (const line of text.split("\n")) {
        const at = line.indexOf("=");
        if (at > 0) value[line.slice(0, at).trim()] = line.slice(at + 1);
      }
    }
    const path = el.dataset.param.split(".");
    let target = body;
    for (const part of path.slice(0, -1)) target = target[part] ??= {};
    target[path.at(-1)] = value;
  }
}
