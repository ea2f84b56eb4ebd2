// Usage: tokens, GPU-seconds and cost per day and per deployment, charted by the page from
// GET /v1/usage. GPU-seconds and cost appear when the platform meters them.

import { barChart } from "../chart.js";
import {
  clear,
  cliHint,
  field,
  fmtInt,
  fmtMicros,
  fmtSeconds,
  h,
  liveLine,
  refresh,
  table,
} from "../dom.js";

const DAY_MS = 86_400_000;

function dayStarts(days) {
  const today = new Date();
  today.setHours(0, 0, 0, 0);
  return Array.from(
    { length: days },
    (_, i) => new Date(today.getTime() - (days - 1 - i) * DAY_MS),
  );
}

function dayLabel(date) {
  return date.toLocaleDateString("en-GB", { day: "numeric", month: "short" });
}

function isoDay(date) {
  const pad = (n) => String(n).padStart(2, "0");
  return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())}`;
}

const METRICS = ["requests", "prompt_tokens", "completion_tokens", "gpu_seconds", "cost_micros"];

function minus(a, b) {
  const out = {};
  for (const m of METRICS) if (a[m] !== undefined) out[m] = (a[m] || 0) - ((b && b[m]) || 0);
  return out;
}

/**
 * Per-day totals for `starts`: from `group_by=day` rows when the platform groups by day,
 * otherwise from totals "since each midnight" (consecutive differences).
 */
async function dailyUsage(api, starts, signal) {
  const first = starts[0].getTime() / 1000;
  const grouped = await api.get(`/v1/usage?start=${first}&group_by=day`, { signal });
  const rows = grouped.data || [];
  if (rows.some((r) => r.day || r.date)) {
    const byDay = new Map(rows.map((r) => [String(r.day || r.date).slice(0, 10), r]));
    return starts.map((d) => byDay.get(isoDay(d)) || {});
  }
  const totals = await Promise.all(
    starts.map((d) =>
      api.get(`/v1/usage?start=${d.getTime() / 1000}`, { signal }).then((b) => b.total || {}),
    ),
  );
  return totals.map((t, i) => minus(t, totals[i + 1]));
}

function summary(total) {
  const card = (label, value, note) =>
    h(
      "div",
      { class: "stat" },
      h("span", { class: "stat-label" }, label),
      h("span", { class: "stat-value", dataset: { metric: label } }, value),
      note ? h("span", { class: "sub" }, note) : null,
    );
  return h(
    "section",
    { class: "stats", "aria-label": "Totals" },
    card("Requests", fmtInt(total.requests || 0)),
    card("Prompt tokens", fmtInt(total.prompt_tokens || 0)),
    card("Completion tokens", fmtInt(total.completion_tokens || 0)),
    card(
      "GPU-seconds",
      total.gpu_seconds === undefined ? "—" : fmtInt(total.gpu_seconds),
      total.gpu_seconds === undefined ? "not metered by this platform yet" : null,
    ),
    card(
      "Cost",
      total.cost_micros === undefined ? "—" : fmtMicros(total.cost_micros),
      total.cost_micros === undefined ? "not priced by this platform yet" : null,
    ),
  );
}

function tokenSeries(rows) {
  return [
    { name: "Prompt tokens", values: rows.map((r) => r.prompt_tokens || 0), format: fmtInt },
    {
      name: "Completion tokens",
      values: rows.map((r) => r.completion_tokens || 0),
      format: fmtInt,
    },
  ];
}

function charts(days, daily, perDeployment, total) {
  const labels = days.map(dayLabel);
  const names = perDeployment.map((r) => r.deployment);
  const out = [
    barChart({
      title: "Tokens per day",
      categories: labels,
      series: tokenSeries(daily),
      format: fmtInt,
    }),
    barChart({
      title: "Tokens per deployment",
      categories: names,
      series: tokenSeries(perDeployment),
      format: fmtInt,
    }),
  ];
  if (total.gpu_seconds !== undefined) {
    const gpu = (rows) => [
      { name: "GPU-seconds", values: rows.map((r) => r.gpu_seconds || 0), format: fmtSeconds },
    ];
    out.push(
      barChart({
        title: "GPU-seconds per day",
        categories: labels,
        series: gpu(daily),
        format: fmtInt,
      }),
      barChart({
        title: "GPU-seconds per deployment",
        categories: names,
        series: gpu(perDeployment),
        format: fmtInt,
      }),
    );
  }
  if (total.cost_micros !== undefined) {
    const cost = [
      { name: "Cost", values: daily.map((r) => r.cost_micros || 0), format: fmtMicros },
    ];
    out.push(
      barChart({
        title: "Cost per day",
        categories: labels,
        series: cost,
        format: fmtMicros,
        // Requests priced at $0 are usage too: the chart says $0.00, not "no usage".
        used: daily.some((r) => (r.requests || 0) > 0 || (r.gpu_seconds || 0) > 0),
      }),
    );
  }
  return h("div", { class: "charts" }, out);
}

/** Columns for every money field (…_micros) the platform reports per deployment. */
function moneyColumns(rows) {
  const keys = new Set(rows.flatMap((r) => Object.keys(r).filter((k) => k.endsWith("_micros"))));
  return [...keys].map((k) => ({
    label: k === "cost_micros" ? "Cost" : k.replace(/_micros$/, "").replaceAll("_", " "),
    num: true,
    cell: (r) => fmtMicros(r[k]),
  }));
}

function deploymentTable(rows) {
  return table({
    label: "Usage per deployment",
    rows,
    rowKey: (r) => r.deployment,
    empty: "No requests in this period.",
    columns: [
      { label: "Deployment", cell: (r) => r.deployment },
      { label: "Requests", num: true, cell: (r) => fmtInt(r.requests || 0) },
      { label: "Prompt tokens", num: true, cell: (r) => fmtInt(r.prompt_tokens || 0) },
      { label: "Completion tokens", num: true, cell: (r) => fmtInt(r.completion_tokens || 0) },
      ...(rows.some((r) => r.gpu_seconds !== undefined)
        ? [{ label: "GPU-seconds", num: true, cell: (r) => fmtInt(r.gpu_seconds || 0) }]
        : []),
      ...moneyColumns(rows),
    ],
  });
}

export async function render(ctx) {
  ctx.setTitle("Usage");
  const range = field({
    label: "Period",
    param: "days",
    options: [
      { value: "7", label: "Last 7 days" },
      { value: "14", label: "Last 14 days" },
      { value: "30", label: "Last 30 days" },
    ],
    value: "7",
  });
  const select = range.querySelector("select");
  const live = liveLine();
  const body = h("div", { class: "view-body" });
  ctx.main.append(
    h(
      "div",
      { class: "view-head" },
      h("h1", {}, "Usage"),
      h("div", { class: "inline-field" }, range),
    ),
    h(
      "p",
      { class: "lede" },
      ctx.session.role === "admin" ? "Every tenant's usage." : "Your tenant's usage.",
    ),
    live.el,
    body,
    cliHint("ebb usage"),
  );
  const load = async () => {
    try {
      const days = dayStarts(Number(select.value));
      const start = days[0].getTime() / 1000;
      const [daily, perDeployment] = await Promise.all([
        dailyUsage(ctx.api, days, ctx.signal),
        ctx.api.get(`/v1/usage?start=${start}&group_by=deployment`, { signal: ctx.signal }),
      ]);
      const rows = (perDeployment.data || []).filter((r) => r.deployment);
      const total = perDeployment.total || {};
      refresh(body, [select.value, daily, rows, total], () => [
        summary(total),
        charts(days, daily, rows, total),
        h("h2", {}, "Per deployment"),
        deploymentTable(rows),
      ]);
      live.ok();
    } catch (error) {
      if (error.name === "AbortError") throw error;
      live.fail(error);
    }
  };
  select.addEventListener("change", () => {
    clear(body, h("p", { class: "muted" }, "Loading…"));
    load();
  });
  await ctx.every(5000, load);
}
