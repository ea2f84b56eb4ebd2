// Jobs: async requests with webhooks — list, status, result and every delivery attempt.
// On a platform without /v1/jobs the view says so instead of failing.

import {
  badge,
  clear,
  cliHint,
  field,
  fmtInt,
  fmtMs,
  fmtTime,
  h,
  liveLine,
  refresh,
  table,
} from "../dom.js";

const STATUSES = ["queued", "running", "succeeded", "failed", "cancelled", "expired"];

function createdOf(job) {
  return job.created ?? job.created_at ?? job.created_at_s ?? null;
}

function attemptsOf(job) {
  const attempts =
    job.delivery_attempts ??
    job.webhook_attempts ??
    job.attempts ??
    job.deliveries ??
    job.webhook?.attempts;
  return Array.isArray(attempts) ? attempts : [];
}

function notAvailable() {
  return h(
    "div",
    { class: "card empty-state", dataset: { jobs: "unavailable" } },
    h("h2", {}, "Async jobs are not available on this platform yet"),
    h(
      "p",
      {},
      "This platform answers 404 for /v1/jobs. Once it runs async jobs, they appear here with their status, results and webhook deliveries.",
    ),
  );
}

function jobLink(job) {
  return h("a", { href: `#/jobs/${encodeURIComponent(job.id)}` }, h("code", {}, job.id));
}

function jobsTable(jobs) {
  return table({
    label: "Jobs",
    rows: jobs,
    rowKey: (j) => j.id,
    empty: "No jobs.",
    columns: [
      { label: "Job", cell: jobLink },
      { label: "Status", cell: (j) => badge(j.status) },
      { label: "Model", cell: (j) => j.model || "—" },
      { label: "Created", cell: (j) => fmtTime(createdOf(j)) },
      { label: "Webhook attempts", num: true, cell: (j) => fmtInt(attemptsOf(j).length) },
    ],
  });
}

function keyValues(label, object) {
  const entries = Object.entries(object || {}).filter(
    ([, v]) => v !== null && typeof v !== "object",
  );
  if (!entries.length) return null;
  return h(
    "section",
    { "aria-label": label },
    h("h2", {}, label),
    h(
      "dl",
      { class: "kv" },
      entries.map(([k, v]) =>
        h(
          "div",
          {},
          h("dt", {}, k.replaceAll("_", " ")),
          h("dd", {}, k.endsWith("_ms") ? fmtMs(v) : String(v)),
        ),
      ),
    ),
  );
}

function attemptsTable(job) {
  return h(
    "section",
    { "aria-labelledby": "attempts-title" },
    h("h2", { id: "attempts-title" }, "Webhook delivery attempts"),
    table({
      label: "Webhook delivery attempts",
      rows: attemptsOf(job),
      empty: job.webhook ? "No delivery attempted yet." : "This job has no webhook.",
      columns: [
        { label: "#", num: true, cell: (a) => String(a.attempt ?? a.number ?? "—") },
        { label: "Event", cell: (a) => a.event ?? a.type ?? "—" },
        { label: "When", cell: (a) => fmtTime(a.at ?? a.attempted_at ?? a.timestamp) },
        { label: "Answer", cell: (a) => String(a.status_code ?? a.status ?? "—") },
        { label: "Latency", num: true, cell: (a) => fmtMs(a.latency_ms) },
        { label: "Error", cell: (a) => (a.error ? h("span", { class: "error" }, a.error) : "") },
      ],
    }),
  );
}

function resultText(job) {
  const content = job.result?.choices?.[0]?.message?.content ?? job.result?.choices?.[0]?.text;
  return content ?? (job.result ? JSON.stringify(job.result, null, 2) : null);
}

function jobDetail(job) {
  const result = resultText(job);
  return [
    h(
      "p",
      { class: "meta" },
      badge(job.status),
      ` ${job.model || ""} · ${job.endpoint || ""} · created ${fmtTime(createdOf(job))}`,
    ),
    job.error
      ? h("p", { class: "error" }, typeof job.error === "string" ? job.error : job.error.message)
      : null,
    result
      ? h(
          "section",
          { "aria-labelledby": "result-title" },
          h("h2", { id: "result-title" }, "Result"),
          h("pre", { class: "log", tabindex: "0" }, result),
        )
      : null,
    keyValues("Usage", job.usage),
    keyValues("Timings", job.timings),
    attemptsTable(job),
    h(
      "details",
      {},
      h("summary", {}, "Raw job object"),
      h("pre", { class: "log" }, JSON.stringify(job, null, 2)),
    ),
  ];
}

async function renderDetail(ctx, id) {
  ctx.setTitle(`Job ${id}`);
  const live = liveLine();
  const body = h("div", { class: "view-body" });
  ctx.main.append(
    h("p", { class: "crumbs" }, h("a", { href: "#/jobs" }, "Jobs"), " / ", id),
    h("h1", {}, `Job ${id}`),
    live.el,
    body,
  );
  await ctx.every(3000, async () => {
    try {
      const job = await ctx.api.get(`/v1/jobs/${encodeURIComponent(id)}`, { signal: ctx.signal });
      refresh(body, job, () => jobDetail(job));
      live.ok();
    } catch (error) {
      if (error.name === "AbortError") throw error;
      if (error.isMissingRoute) refresh(body, "unavailable", () => notAvailable());
      else if (error.status === 404)
        refresh(body, error.message, () => h("p", { class: "error" }, error.message));
      else live.fail(error);
    }
  });
}

export async function render(ctx) {
  if (ctx.params[0]) return renderDetail(ctx, ctx.params[0]);
  ctx.setTitle("Jobs");
  const filter = field({
    label: "Status",
    param: "status",
    options: [{ value: "", label: "Any status" }, ...STATUSES.map((s) => ({ value: s, label: s }))],
    value: "",
  });
  const select = filter.querySelector("select");
  const head = h("div", { class: "view-head" }, h("h1", {}, "Jobs"));
  ctx.main.append(head);
  const path = () => `/v1/jobs?limit=50${select.value ? `&status=${select.value}` : ""}`;
  let first;
  try {
    first = await ctx.api.get(path(), { signal: ctx.signal });
  } catch (error) {
    if (error.isMissingRoute) return ctx.main.append(notAvailable());
    throw error;
  }
  const live = liveLine();
  const body = h("div", { class: "view-body" });
  head.append(h("div", { class: "inline-field" }, filter));
  ctx.main.append(live.el, body, cliHint("ebb jobs"));
  const show = (list) => refresh(body, [select.value, list.data], () => jobsTable(list.data || []));
  show(first);
  live.ok();
  select.addEventListener("change", () => {
    clear(body);
    ctx.api.get(path(), { signal: ctx.signal }).then(show, (e) => live.fail(e));
  });
  await ctx.every(3000, async () => {
    show(await ctx.api.get(path(), { signal: ctx.signal }));
    live.ok();
  });
}
