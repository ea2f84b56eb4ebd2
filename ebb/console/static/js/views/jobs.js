// Jobs: async requests with webhooks — submit, list, status, result, cancel and every
// delivery attempt; the tenant's webhook signing secret and its rotation.
// On a platform without /v1/jobs the view says so instead of failing.

import {
  badge,
  clear,
  cliHint,
  confirmDialog,
  field,
  fmtInt,
  fmtMs,
  fmtTime,
  h,
  liveLine,
  refresh,
  table,
} from "../dom.js";
import { jobForm } from "../jobform.js";
import { webhookSecretSection } from "../webhook_secret.js";

const STATUSES = ["queued", "running", "succeeded", "failed", "cancelled", "expired"];

function createdOf(job) {
  return job.created ?? job.created_at ?? job.created_at_s ?? null;
}

/** Every delivery attempt of the job's webhook events, oldest first. */
function attemptsOf(job) {
  const out = [];
  for (const d of job.deliveries || []) {
    (d.attempts || []).forEach((a, i) => out.push({ ...a, attempt: i + 1, event: d.event }));
  }
  return out.sort((a, b) => (a.at ?? 0) - (b.at ?? 0));
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

const SETTLED = new Set(["succeeded", "failed", "cancelled", "expired"]);

function cancelButton(ctx, job) {
  if (SETTLED.has(job.status)) return null;
  if (job.cancel_requested) return h("p", { class: "muted" }, "Cancel requested…");
  const button = h("button", { type: "button", class: "button danger" }, "Cancel job");
  button.addEventListener("click", async () => {
    const sure = await confirmDialog({
      title: `Cancel ${job.id}?`,
      message:
        "A queued job is dropped; a running one is stopped and billed for the tokens it produced.",
      confirmLabel: "Cancel job",
    });
    if (!sure) return;
    try {
      const after = await ctx.api.del(`/v1/jobs/${encodeURIComponent(job.id)}`);
      ctx.flash(`Job ${job.id} is ${after.status}.`);
    } catch (error) {
      ctx.flash(error.message, "bad");
    }
  });
  return button;
}

function jobDetail(ctx, job) {
  const result = resultText(job);
  return [
    h(
      "p",
      { class: "meta" },
      badge(job.status),
      ` ${job.model || ""} · ${job.endpoint || ""} · created ${fmtTime(createdOf(job))}`,
    ),
    h("div", { class: "actions" }, cancelButton(ctx, job)),
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
      refresh(body, job, () => jobDetail(ctx, job));
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
  const models = (await ctx.api.get("/v1/models", { signal: ctx.signal })).data
    .filter((m) => m.capabilities?.chat_completions !== false)
    .map((m) => m.id)
    .sort();
  const submitForm = models.length
    ? jobForm(ctx, models, (job) =>
        ctx.navigate(`#/jobs/${encodeURIComponent(job.id)}`, `Submitted ${job.id}.`),
      )
    : h("p", { class: "muted" }, "No chat model is deployed: deploy one to submit jobs.");
  const secret = webhookSecretSection(ctx);
  ctx.main.append(
    live.el,
    body,
    cliHint("ebb jobs · ebb jobs submit MODEL --prompt TEXT · ebb jobs cancel JOB_ID"),
    h("div", { class: "manage" }, submitForm, secret.el),
  );
  await secret.load();
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
