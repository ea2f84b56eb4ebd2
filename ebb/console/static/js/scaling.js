// The scaling fields (min/max replicas, idle timeout), shared by the deploy form and the
// deployment's Scale form so both ask, explain and read them the same way.

import { field, h, numberOrNull } from "./dom.js";

const SCALING = [
  {
    param: "min_replicas",
    label: "Min replicas",
    min: "0",
    step: "1",
    hint: "Kept running even when idle; 0 scales to zero.",
  },
  {
    param: "max_replicas",
    label: "Max replicas",
    min: "1",
    step: "1",
    hint: "Most runners at once.",
  },
  {
    param: "idle_timeout_s",
    label: "Idle timeout (s)",
    min: "1",
    step: "any",
    hint: "Idle seconds before a runner drains.",
  },
];

/** The three fields, filled from `values` (a deployment, or the defaults of a new one). */
export function scalingFields(values) {
  return h(
    "div",
    { class: "grid three" },
    SCALING.map((s) => field({ ...s, type: "number", value: String(values[s.param]) })),
  );
}

/** {min_replicas, max_replicas, idle_timeout_s} as typed; empty fields are left out. */
export function readScaling(form) {
  const body = {};
  for (const { param } of SCALING) {
    const value = numberOrNull(form.querySelector(`[data-param="${param}"]`));
    if (value !== null) body[param] = value;
  }
  return body;
}
