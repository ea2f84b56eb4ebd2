// Prices on the deploy form. The fields come from the platform's own OpenAPI schema: the
// form offers whatever price fields the API's DeploymentCreate takes (top-level, or one
// object deep such as `pricing.input_per_1m_micros`), and nothing when it takes none.

import { field, h, numberOrNull } from "./dom.js";

function resolve(schema, prop) {
  const ref =
    prop.$ref || prop.allOf?.find((p) => p.$ref)?.$ref || prop.anyOf?.find((p) => p.$ref)?.$ref;
  return ref ? schema.components.schemas[ref.split("/").pop()] || prop : prop;
}

function label(name) {
  const words = name
    .replace(/_micros$/, "")
    .replaceAll("_", " ")
    .replace(/\b1m\b/, "1M")
    .replace(/\bgpu\b/, "GPU");
  return words.charAt(0).toUpperCase() + words.slice(1);
}

/** [{param, title, hint, micros}] for every price the API takes on a new deployment. */
export function priceFields(schema) {
  const props = schema?.components?.schemas?.DeploymentCreate?.properties || {};
  const out = [];
  for (const [name, prop] of Object.entries(props)) {
    if (!/pric/i.test(name)) continue;
    const target = resolve(schema, prop);
    const leaves = target.properties ? Object.entries(target.properties) : [[null, prop]];
    for (const [sub, leaf] of leaves) {
      const key = sub || name;
      out.push({
        param: sub ? `${name}.${sub}` : name,
        title: label(key),
        hint: leaf.description,
        micros: key.includes("micros"),
      });
    }
  }
  return out;
}

export function priceFieldset(prices) {
  const legend = h("legend", {}, "Prices");
  if (!prices.length) {
    return h(
      "fieldset",
      { class: "prices" },
      legend,
      h(
        "p",
        { class: "hint" },
        "This platform does not take prices per deployment yet; tokens and time are still metered.",
      ),
    );
  }
  return h(
    "fieldset",
    { class: "prices" },
    legend,
    h(
      "div",
      { class: "grid" },
      prices.map((p) =>
        field({
          // Money travels in integer micro-units; people type currency units.
          label: `${p.title}${p.micros ? " ($)" : ""}`,
          param: p.param,
          type: "number",
          min: "0",
          step: "any",
          inputmode: "decimal",
          hint: p.hint || "Leave empty for the platform's default.",
        }),
      ),
    ),
  );
}

/** Adds the filled-in prices to a request body, nesting dotted params. */
export function readPrices(form, prices, body) {
  for (const p of prices) {
    const value = numberOrNull(form.querySelector(`[data-param="${CSS.escape(p.param)}"]`));
    if (value === null) continue;
    const path = p.param.split(".");
    let target = body;
    for (const part of path.slice(0, -1)) target = target[part] ??= {};
    target[path.at(-1)] = p.micros ? Math.round(value * 1e6) : value;
  }
}
