// Deployments: every deployment with its replicas by state, queue, cold start and usage.

import { badge, cliHint, fmtInt, h, liveLine, refresh, table } from "../dom.js";
import {
  coldStartText,
  costText,
  replicaCounts,
  replicaStates,
  startOfToday,
  tokensOf,
  usageByDeployment,
} from "../model.js";

function statusCell(d) {
  return h(
    "div",
    { class: "status-cell" },
    badge(d.status),
    d.status === "preparing" ? h("span", { class: "sub" }, "weights") : null,
    d.error ? h("span", { class: "sub error", title: d.error }, d.error) : null,
  );
}

const detailLink = (name) => h("a", { href: `#/deployments/${encodeURIComponent(name)}` }, name);

/** The name, and for a LoRA adapter the base deployment whose runners serve it. */
function nameCell(d) {
  if (!d.base) return detailLink(d.name);
  return h(
    "div",
    { class: "status-cell" },
    detailLink(d.name),
    h("span", { class: "sub", dataset: { base: d.base } }, "adapter of ", detailLink(d.base)),
  );
}

function deploymentsTable(rows, minute, today) {
  const columns = [
    {
      label: "Name",
      cell: nameCell,
    },
    { label: "Status", cell: statusCell },
    ...replicaStates(rows).map((s) => ({
      label: s.label,
      num: true,
      cell: (d) => String(replicaCounts(d)[s.key] || 0),
    })),
    { label: "Queue", num: true, cell: (d) => String(d.queue_depth) },
    { label: "Cold start", cell: coldStartText },
    { label: "Tokens/min", num: true, cell: (d) => fmtInt(tokensOf(minute.rows.get(d.name))) },
    { label: "Cost today", num: true, cell: (d) => costText(today.rows.get(d.name), today.total) },
    { label: "Min–max", num: true, cell: (d) => `${d.min_replicas}–${d.max_replicas}` },
  ];
  return table({ label: "Deployments", columns, rows, rowKey: (d) => d.name });
}

function emptyState(isAdmin) {
  return h(
    "div",
    { class: "card empty-state" },
    h("h2", {}, "No deployments yet"),
    h(
      "p",
      {},
      "A deployment gives a model an OpenAI-compatible name. It costs nothing while idle: " +
        "runners start when requests arrive and drain away afterwards.",
    ),
    h("a", { href: "#/deploy", class: "button primary" }, "Deploy a model"),
    isAdmin ? null : h("p", { class: "hint" }, "Within the quota the administrator set for your tenant."),
  );
}

/** GET /v1/status (admin), or null on a platform without it. */
async function platformStatus(api, signal) {
  try {
    return await api.get("/v1/status", { signal });
  } catch (error) {
    if (error.isMissingRoute) return null;
    throw error;
  }
}

/** Pre-warmed runners belong to no deployment until one needs them: the shared pool. */
function poolLine(platform) {
  const pool = platform?.pool;
  if (!pool) return null;
  return h(
    "p",
    { class: "pool", dataset: { pool: "" } },
    h("strong", {}, "Pre-warmed pool: "),
    `${pool.prewarmed} ready, ${pool.starting} starting (target ${pool.target}). `,
    h("span", { class: "muted" }, "A request for a deployment at zero takes one of these first"),
    platform.fork_server === "ready"
      ? h("span", { class: "muted" }, "; beyond them, runners are forked from the fork server.")
      : h("span", { class: "muted" }, `. Fork server: ${platform.fork_server ?? "off"}.`),
  );
}

const GIB = 1024 ** 3;

/** Each host's GPUs: free and reserved memory, load, temperature, the runners on each. */
function gpusLine(platform) {
  const hosts = (platform?.gpus || []).filter((host) => host.devices.length);
  if (!hosts.length) return null;
  return h(
    "ul",
    { class: "gpus", dataset: { gpus: "" }, "aria-label": "GPUs" },
    hosts.flatMap((host) =>
      host.devices.map((d) =>
        h(
          "li",
          {},
          h("strong", {}, `${host.host} GPU ${d.index}`),
          ` ${d.name}: ${(d.free_bytes / GIB).toFixed(1)} of ${(d.total_bytes / GIB).toFixed(1)} GiB free, `,
          `${(d.reserved_bytes / GIB).toFixed(1)} GiB reserved by ${d.runners.length} runner(s), `,
          `${d.utilization_pct} % busy, ${d.temperature_c} °C`,
        ),
      ),
    ),
  );
}

export async function render(ctx) {
  ctx.setTitle("Deployments");
  const isAdmin = ctx.session.role === "admin";
  const live = liveLine();
  const body = h("div", { class: "view-body" });
  ctx.main.append(
    h(
      "div",
      { class: "view-head" },
      h("h1", {}, "Deployments"),
      // Tenants deploy their own within their quota; the platform says when one is reached.
      h("a", { href: "#/deploy", class: "button primary" }, "Deploy a model"),
    ),
    live.el,
    body,
    cliHint("ebb deployments"),
  );
  const { api, signal } = ctx;
  await ctx.every(2000, async () => {
    try {
      const [list, minute, today, platform] = await Promise.all([
        api.get("/v1/deployments", { signal }),
        usageByDeployment(api, Date.now() / 1000 - 60, signal),
        usageByDeployment(api, startOfToday(), signal),
        isAdmin ? platformStatus(api, signal) : null,
      ]);
      const data = [
        list.data,
        [...minute.rows],
        [...today.rows],
        today.total,
        platform?.pool,
        platform?.gpus,
      ];
      refresh(body, data, () => [
        poolLine(platform),
        gpusLine(platform),
        list.data.length ? deploymentsTable(list.data, minute, today) : emptyState(isAdmin),
      ]);
      live.ok();
    } catch (error) {
      if (error.name === "AbortError") throw error;
      live.fail(error);
    }
  });
}
