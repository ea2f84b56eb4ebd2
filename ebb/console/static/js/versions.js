// A deployment's versions and rollouts (admin), on its detail view: each version's
// source, traffic share and runners; roll out a version (immediate, or a canary share
// promoted by hand), promote the canary, roll back. GET /v1/deployments/NAME/versions,
// POST .../rollout, .../rollout/promote and .../rollback. A platform without versions
// answers 404 "No route" and the section stays away.

import {
  badge,
  clearErrors,
  cliHint,
  confirmDialog,
  field,
  fmtInt,
  fmtTime,
  formError,
  h,
  numberOrNull,
  refresh,
  showFormError,
  table,
} from "./dom.js";

function rolloutText(r) {
  if (!r) return "No rollout: all traffic goes to the current version.";
  const step = r.step >= 0 ? r.steps[r.step] : 0;
  const what = `v${r.from_version} → v${r.to_version} (${r.strategy})`;
  if (r.state === "warming") return `Rolling out ${what}: warming a runner, no traffic yet.`;
  if (r.state === "running") return `Rolling out ${what}: v${r.to_version} takes ${step}%.`;
  if (r.state === "done") return `Rolled out ${what}: v${r.to_version} takes all traffic.`;
  if (r.state === "rolled_back")
    return `Rolled back ${what}${r.reason ? `: ${r.reason}` : ""}; v${r.from_version} takes all traffic.`;
  return `Rollout ${what}: ${r.state}.`;
}

function versionsTable(body) {
  return table({
    label: "Versions",
    rows: [...body.data].reverse(),
    rowKey: (v) => `v${v.version}`,
    columns: [
      { label: "Version", cell: (v) => `v${v.version}` },
      { label: "Source", cell: (v) => h("code", {}, v.source || "—") },
      { label: "Created", cell: (v) => fmtTime(v.created_at_s) },
      { label: "Traffic", num: true, cell: (v) => `${fmtInt(v.traffic_pct)}%` },
      { label: "Ready", num: true, cell: (v) => `${v.ready_replicas}/${v.replicas}` },
      { label: "Weights", cell: (v) => badge(v.weights) },
    ],
  });
}

function rolloutForm(ctx, name, body, after) {
  const latest = Math.max(...body.data.map((v) => v.version));
  const strategy = field({
    label: "Strategy",
    param: "strategy",
    options: [
      { value: "immediate", label: "immediate: all traffic once it is ready" },
      { value: "canary", label: "canary: a share first, promoted by hand" },
    ],
    value: "immediate",
  });
  const form = h(
    "form",
    { class: "card", novalidate: true, "aria-labelledby": "rollout-title" },
    h("h3", { id: "rollout-title" }, "Roll out a version"),
    h(
      "div",
      { class: "grid three" },
      field({
        label: "Version",
        param: "version",
        options: body.data.map((v) => ({ value: String(v.version), label: `v${v.version}` })),
        value: String(latest),
      }),
      strategy,
      field({
        label: "Canary share (%)",
        param: "canary_pct",
        type: "number",
        min: "1",
        max: "99",
        step: "1",
        value: "10",
        hint: "A canary's first share of the traffic.",
      }),
    ),
    formError(),
    h(
      "div",
      { class: "actions" },
      h("button", { type: "submit", class: "button primary" }, "Roll out"),
    ),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clearErrors(form);
    const control = (p) => form.querySelector(`[data-param="${p}"]`);
    const request = {
      version: Number(control("version").value),
      strategy: control("strategy").value,
    };
    if (request.strategy === "canary") request.canary_pct = numberOrNull(control("canary_pct"));
    try {
      after(await ctx.api.post(`/v1/deployments/${encodeURIComponent(name)}/rollout`, request));
      ctx.flash(`Rolling out v${request.version} of ${name} (${request.strategy}).`);
    } catch (error) {
      showFormError(form, error);
    }
  });
  return form;
}

function actionButtons(ctx, name, body, after) {
  const r = body.rollout;
  const active = r && (r.state === "warming" || r.state === "running");
  const promote = h("button", { type: "button", class: "button" }, "Promote");
  promote.addEventListener("click", async () => {
    try {
      after(await ctx.api.post(`/v1/deployments/${encodeURIComponent(name)}/rollout/promote`, {}));
    } catch (error) {
      ctx.flash(error.message, "bad");
    }
  });
  const back = h("button", { type: "button", class: "button danger" }, "Roll back");
  back.addEventListener("click", async () => {
    const sure = await confirmDialog({
      title: `Roll back ${name}?`,
      message: r
        ? `All traffic returns to v${r.from_version}; v${r.to_version}'s runners finish what they hold, then drain.`
        : "All traffic returns to the previous version.",
      confirmLabel: "Roll back",
    });
    if (!sure) return;
    try {
      after(await ctx.api.post(`/v1/deployments/${encodeURIComponent(name)}/rollback`, {}));
      ctx.flash(`Rolled back ${name}.`);
    } catch (error) {
      ctx.flash(error.message, "bad");
    }
  });
  return h(
    "div",
    { class: "actions" },
    active && r.strategy === "canary" ? promote : null,
    r && r.state !== "rolled_back" ? back : null,
  );
}

/** The section, or null when this platform has no versions API. */
export async function versionsSection(ctx, name) {
  const path = `/v1/deployments/${encodeURIComponent(name)}/versions`;
  let body;
  try {
    body = await ctx.api.get(path, { signal: ctx.signal });
  } catch (error) {
    if (error.isMissingRoute) return null;
    throw error;
  }
  const status = h("p", { class: "meta", dataset: { rollout: "" } });
  const list = h("div", {});
  const controls = h("div", {});
  const show = (b) => {
    body = b;
    status.dataset.rollout = b.rollout ? b.rollout.state : "none";
    status.textContent = rolloutText(b.rollout);
    refresh(list, b.data, () => versionsTable(b));
    refresh(controls, [b.data.map((v) => v.version), b.rollout?.state, b.rollout?.to_version], () => [
      actionButtons(ctx, name, b, show),
      rolloutForm(ctx, name, b, show),
    ]);
  };
  show(body);
  return {
    el: h(
      "section",
      { "aria-labelledby": "versions-title" },
      h("h2", { id: "versions-title" }, "Versions"),
      status,
      list,
      controls,
      cliHint(`ebb deployments history ${name} · ebb rollout ${name} --canary 10 · ebb rollback ${name}`),
    ),
    async poll() {
      show(await ctx.api.get(path, { signal: ctx.signal }));
    },
  };
}
