// One deployment: replicas, queue, cold starts, runners with their last log lines, recent
// errors; versions and rollouts (where the platform has them), scale and delete for the
// admin and for the tenant that owns it.

import {
  badge,
  clear,
  clearErrors,
  cliHint,
  confirmDialog,
  fmtClock,
  fmtMs,
  fmtSeconds,
  fmtTime,
  formError,
  h,
  liveLine,
  refresh,
  showFormError,
  table,
} from "../dom.js";
import { progressBar, replicaCounts, replicaStates, weightsProgress } from "../model.js";
import { readScaling, scalingFields } from "../scaling.js";
import { versionsSection } from "../versions.js";

function stat(label, value, extra) {
  return h(
    "div",
    { class: "stat" },
    h("span", { class: "stat-label" }, label),
    h("span", { class: "stat-value" }, value),
    extra,
  );
}

function overview(d) {
  const counts = replicaCounts(d);
  const progress =
    d.weights === "preparing" ? progressBar(weightsProgress(d), "Weight prefetch progress") : null;
  return h(
    "section",
    { class: "stats", "aria-label": "Overview" },
    replicaStates([d]).map((s) => stat(s.label, String(counts[s.key] || 0))),
    stat(
      "Queue depth",
      String(d.queue_depth),
      d.queue_depth
        ? h("span", { class: "sub" }, `oldest waits ${fmtSeconds(d.oldest_wait_s)}`)
        : null,
    ),
    stat("Weights", d.weights === "unknown" ? "—" : d.weights, progress),
  );
}

function coldStarts(d) {
  const rows = Object.entries(d.cold_start_ms || {}).map(([tier, phases]) => ({ tier, phases }));
  return h(
    "section",
    { "aria-labelledby": "cold-title" },
    h("h2", { id: "cold-title" }, "Cold starts"),
    table({
      label: "Cold start time by tier",
      rows,
      empty: "No cold start measured yet: the first request starts a runner.",
      columns: [
        { label: "Tier", cell: (r) => r.tier.replaceAll("_", " ") },
        { label: "Total", num: true, cell: (r) => fmtMs(r.phases.total) },
        {
          label: "Phases",
          cell: (r) =>
            Object.entries(r.phases)
              .filter(([k]) => k !== "total")
              .map(([k, v]) => `${k} ${fmtMs(v)}`)
              .join(" · "),
        },
      ],
    }),
  );
}

/** Log tails; the newest runner's is open unless the user closed it (toggles persist). */
function runnerLogs(runners, toggled) {
  return runners
    .filter((r) => r.log_tail && r.log_tail.length)
    .map((r, i) => {
      const open = toggled.has(r.id) ? toggled.get(r.id) : i === 0;
      const details = h(
        "details",
        { class: "runner-log", open },
        h("summary", { id: `log-${r.id}` }, `Last log lines of ${r.id} (${r.state})`),
        h(
          "pre",
          { class: "log", tabindex: "0", "aria-label": `Log of ${r.id}` },
          r.log_tail.join("\n"),
        ),
      );
      details.addEventListener("toggle", () => toggled.set(r.id, details.open));
      return details;
    });
}

function runnersSection(d, toggled) {
  const runners = [...(d.runners || [])].sort((a, b) => b.launched_ms - a.launched_ms);
  return h(
    "section",
    { "aria-labelledby": "runners-title" },
    h("h2", { id: "runners-title" }, "Runners"),
    table({
      label: "Runners",
      rows: runners,
      rowKey: (r) => r.id,
      empty: "No runners: the deployment is scaled to zero.",
      columns: [
        { label: "Runner", cell: (r) => h("code", {}, r.id) },
        { label: "State", cell: (r) => badge(r.state) },
        // Where the platform has versions, each runner serves one.
        runners.some((r) => r.version)
          ? { label: "Version", cell: (r) => (r.version ? `v${r.version}` : "—") }
          : null,
        { label: "Tier", cell: (r) => (r.tier || "—").replaceAll("_", " ") },
        { label: "PID", num: true, cell: (r) => String(r.pid || "—") },
        { label: "Launched", cell: (r) => fmtClock(r.launched_ms) },
        { label: "Ready", cell: (r) => fmtClock(r.ready_ms) },
        { label: "Error", cell: (r) => (r.error ? h("span", { class: "error" }, r.error) : "") },
        {
          label: "Logs",
          cell: (r) =>
            h(
              "a",
              {
                href: `#/logs/${encodeURIComponent(d.name)}/${encodeURIComponent(r.id)}`,
                "aria-label": `Follow the log of ${r.id}`,
              },
              "Follow",
            ),
        },
      ],
    }),
    runnerLogs(runners, toggled),
  );
}

function errorsSection(d) {
  const failed = (d.runners || []).filter((r) => r.error);
  const items = [];
  if (d.error)
    items.push(
      h(
        "li",
        {},
        h("p", { class: "error" }, d.error),
        d.error_log ? h("pre", { class: "log" }, d.error_log) : null,
      ),
    );
  for (const r of failed) items.push(h("li", {}, h("p", {}, h("code", {}, r.id), `: ${r.error}`)));
  return h(
    "section",
    { "aria-labelledby": "errors-title" },
    h("h2", { id: "errors-title" }, "Recent errors"),
    items.length
      ? h("ul", { class: "errors" }, items)
      : h("p", { class: "muted" }, "No recent errors."),
  );
}

function scaleForm(ctx, d) {
  const done = h("p", { class: "form-ok", role: "status" });
  const form = h(
    "form",
    { class: "card", novalidate: true, "aria-labelledby": "scale-title" },
    h("h2", { id: "scale-title" }, "Scale"),
    scalingFields(d),
    formError(),
    done,
    h(
      "div",
      { class: "actions" },
      h("button", { type: "submit", class: "button primary" }, "Scale"),
    ),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clearErrors(form);
    done.textContent = "";
    try {
      const path = `/v1/deployments/${encodeURIComponent(d.name)}`;
      const updated = await ctx.api.patch(path, readScaling(form));
      done.textContent = `Scaled: min ${updated.min_replicas}, max ${updated.max_replicas}, idle timeout ${updated.idle_timeout_s} s.`;
    } catch (error) {
      showFormError(form, error);
    }
  });
  return form;
}

function deleteSection(ctx, name) {
  const button = h("button", { type: "button", class: "button danger" }, "Delete deployment");
  button.addEventListener("click", async () => {
    const sure = await confirmDialog({
      title: `Delete ${name}?`,
      message: `Its runners finish what they hold, then exit. Requests for model "${name}" will get 404 from now on.`,
      confirmLabel: "Delete",
    });
    if (!sure) return;
    try {
      await ctx.api.del(`/v1/deployments/${encodeURIComponent(name)}`);
      ctx.navigate("#/deployments", `Deleted ${name}.`);
    } catch (error) {
      ctx.flash(error.message, "bad");
    }
  });
  return h(
    "section",
    { class: "card danger-zone", "aria-labelledby": "delete-title" },
    h("h2", { id: "delete-title" }, "Delete"),
    h("p", {}, "Removes the deployment; in-flight requests still finish."),
    button,
  );
}

export async function render(ctx) {
  const name = ctx.params[0];
  ctx.setTitle(name);
  const status = h("span", {});
  const meta = h("p", { class: "meta" });
  const live = liveLine();
  const body = h("div", { class: "view-body" });
  ctx.main.append(
    h("p", { class: "crumbs" }, h("a", { href: "#/deployments" }, "Deployments"), " / ", name),
    h("div", { class: "view-head" }, h("h1", {}, name), status),
    meta,
    live.el,
    body,
  );
  const toggled = new Map(); // runner id -> whether the user left its log open
  let liveArea = null; // built on the first answer; forms below it are built once
  let versions = null; // the versions section, where the platform has versions
  await ctx.every(2000, async () => {
    let d;
    try {
      d = await ctx.api.get(`/v1/deployments/${encodeURIComponent(name)}`, { signal: ctx.signal });
    } catch (error) {
      if (error.name === "AbortError") throw error;
      if (error.status === 404) {
        clear(
          body,
          h("p", { class: "error" }, error.message),
          h("a", { href: "#/deployments" }, "Back to deployments"),
        );
        return;
      }
      live.fail(error);
      return;
    }
    live.ok();
    clear(status, badge(d.status));
    clear(
      meta,
      ...(d.base
        ? [
            "LoRA adapter of ",
            h(
              "a",
              { href: `#/deployments/${encodeURIComponent(d.base)}`, dataset: { base: d.base } },
              d.base,
            ),
            " (served by its runners) · ",
          ]
        : []),
      ...(d.source ? ["Source ", h("code", {}, d.source), " · "] : []),
      `created ${fmtTime(d.created_at_s)} · ${d.min_replicas}–${d.max_replicas} replicas · idle timeout ${d.idle_timeout_s} s`,
      engineSummary(d),
    );
    if (!liveArea) {
      liveArea = h("div", { class: "live-area" });
      const admin = ctx.session.role === "admin";
      // The platform shows a deployment whole (its source too) to whoever may change it.
      const manages = admin || d.source !== undefined;
      versions = manages ? await versionsSection(ctx, name) : null;
      clear(
        body,
        liveArea,
        versions?.el,
        manages ? h("div", { class: "manage" }, scaleForm(ctx, d), deleteSection(ctx, name)) : null,
        manages
          ? h(
              "p",
              {},
              h("a", { href: `#/logs/${encodeURIComponent(name)}` }, "Follow the runners' logs live"),
            )
          : null,
        cliHint(`ebb deployments show ${name}`),
      );
    }
    refresh(liveArea, d, () => [
      overview(d),
      coldStarts(d),
      runnersSection(d, toggled),
      errorsSection(d),
    ]);
    await versions?.poll();
  });
}

/** " · engine dtype bfloat16, max_num_seqs 64" for the options a deployment set. */
function engineSummary(d) {
  const set = Object.entries(d.engine || {}).filter(([, v]) => v !== null);
  if (d.max_model_len) set.unshift(["max_model_len", d.max_model_len]);
  return set.length ? ` · engine ${set.map(([k, v]) => `${k} ${v}`).join(", ")}` : "";
}
