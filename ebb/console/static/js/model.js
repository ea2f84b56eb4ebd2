// Reading the API's deployment and usage objects. Fields that later platform versions add
// (weights progress, GPU-seconds, cost) are optional here: shown when present.

import { fmtMicros, fmtMs, h } from "./dom.js";

const BASE_STATES = [
  { key: "prewarmed", label: "Pre-warmed" },
  { key: "loading", label: "Loading" },
  { key: "ready", label: "Ready" },
  { key: "draining", label: "Draining" },
];
const FOLDED = new Set(["starting", ...BASE_STATES.map((s) => s.key)]);

/**
 * The replica states to show for `deployments`: the four every platform has, plus any
 * other live state the platform reports (e.g. "sleeping" where engines can sleep).
 */
export function replicaStates(deployments) {
  const extra = new Set();
  for (const d of deployments) {
    for (const key of Object.keys(d.replicas || {})) if (!FOLDED.has(key)) extra.add(key);
  }
  const label = (key) => key.charAt(0).toUpperCase() + key.slice(1).replaceAll("_", " ");
  return [...BASE_STATES, ...[...extra].sort().map((key) => ({ key, label: label(key) }))];
}

/** Replicas by state; "starting" (a fresh process importing libraries) counts as loading. */
export function replicaCounts(deployment) {
  const r = deployment.replicas || {};
  return { ...r, loading: (r.loading || 0) + (r.starting || 0) };
}

/** The fastest measured cold start over tiers: {tier, totalMs, phases} or null. */
export function bestColdStart(deployment) {
  let best = null;
  for (const [tier, phases] of Object.entries(deployment.cold_start_ms || {})) {
    if (phases.total === undefined) continue;
    if (!best || phases.total < best.totalMs) best = { tier, totalMs: phases.total, phases };
  }
  return best;
}

export function coldStartText(deployment) {
  const best = bestColdStart(deployment);
  return best ? `${fmtMs(best.totalMs)} (${best.tier.replaceAll("_", " ")})` : "not measured yet";
}

function fraction(done, total) {
  return typeof done === "number" && typeof total === "number" && total > 0
    ? Math.min(1, done / total)
    : null;
}

/**
 * Weight prefetch progress in [0, 1], or null when the platform does not report it.
 * Accepts a number, or an object or fields with done/total bytes under common names.
 */
export function weightsProgress(deployment) {
  const p = deployment.weights_progress ?? deployment.prefetch ?? null;
  if (typeof p === "number") return p > 1 ? p / 100 : p;
  const source = p && typeof p === "object" ? p : deployment;
  const done =
    source.done_bytes ?? source.bytes_done ?? source.fetched_bytes ?? source.weights_fetched_bytes;
  const total = source.total_bytes ?? source.bytes_total ?? source.weights_total_bytes;
  return fraction(done, total);
}

export function progressBar(value, label) {
  // <progress> without a value is indeterminate: the platform says "preparing", not how far.
  const bar = h("progress", { max: "1", "aria-label": label });
  if (value !== null && value !== undefined) bar.value = value;
  return bar;
}

export function tokensOf(row) {
  return row ? (row.prompt_tokens || 0) + (row.completion_tokens || 0) : 0;
}

export function startOfToday() {
  const d = new Date();
  d.setHours(0, 0, 0, 0);
  return d.getTime() / 1000;
}

/** GET /v1/usage?start= as a Map deployment -> row (the caller's own usage). */
export async function usageByDeployment(api, startS, signal) {
  const body = await api.get(`/v1/usage?start=${startS.toFixed(3)}&group_by=deployment`, {
    signal,
  });
  const rows = new Map();
  for (const row of body.data || []) if (row.deployment) rows.set(row.deployment, row);
  return { rows, total: body.total || {} };
}

/** A row's cost, "—" while the platform does not meter cost (no cost_micros in total). */
export function costText(row, total) {
  if (!total || total.cost_micros === undefined) return "—";
  return fmtMicros(row?.cost_micros || 0);
}
