// Rate limits (admin) on the keys view: per tenant (shared by all its keys) and per key,
// requests and tokens per minute; empty means unlimited. PUT /v1/tenants/T/limits and
// PUT /v1/keys/ID/limits, read back from GET /v1/tenants and GET /v1/keys.

import {
  clearErrors,
  cliHint,
  field,
  fmtInt,
  fmtMicros,
  formError,
  h,
  numberOrNull,
  refresh,
  showFieldError,
  showFormError,
  table,
} from "./dom.js";

export function limitText(value) {
  return value === null || value === undefined ? "unlimited" : `${fmtInt(value)}/min`;
}

export function tenantsTable(tenants) {
  return table({
    label: "Tenants",
    rows: tenants,
    rowKey: (t) => t.tenant,
    empty: "No tenants yet: create a key for one.",
    columns: [
      { label: "Tenant", cell: (t) => t.tenant },
      { label: "Active keys", num: true, cell: (t) => fmtInt(t.active_keys) },
      { label: "Requests", num: true, cell: (t) => limitText(t.limits.requests_per_minute) },
      { label: "Tokens", num: true, cell: (t) => limitText(t.limits.tokens_per_minute) },
      { label: "Priority", cell: (t) => t.priority ?? "standard" },
      { label: "Budget", cell: (t) => budgetText(t.budget) },
      { label: "Quota", cell: (t) => quotaText(t.quota) },
    ],
  });
}

/** What a tenant may deploy itself; 0 is none at all, as no quota is. */
export function quotaText(quota) {
  if (!quota) return "none: deploys nothing";
  const bound = (n, what) => `${n === 0 ? "no" : fmtInt(n)} ${what}`;
  return [
    bound(quota.max_deployments, "deployments"),
    bound(quota.max_replicas, "replicas"),
    bound(quota.max_gpus, "GPUs"),
  ].join(" · ");
}

/** "$1.20 of $50.00 per day", or "none": a spend cap and this period's spend. */
export function budgetText(budget) {
  if (!budget) return "none";
  const per = budget.period ? `per ${budget.period}` : "lifetime";
  return `${fmtMicros(budget.spent_micros)} of ${fmtMicros(budget.amount_micros)} ${per}`;
}

/** "Set a tenant's quota": what its own deployments may add up to (PUT .../quota). */
function quotaForm(ctx, reload) {
  const done = h("p", { class: "form-ok", role: "status" });
  const form = h(
    "form",
    { class: "card", novalidate: true, "aria-labelledby": "quota-title" },
    h("h2", { id: "quota-title" }, "Set a tenant's quota"),
    h(
      "p",
      { class: "hint" },
      "Tenants deploy their own models within it. Setting it replaces the whole quota; an empty number is 0.",
    ),
    h(
      "div",
      { class: "grid two" },
      field({
        label: "Quota of tenant",
        param: "tenant",
        autocomplete: "off",
        spellcheck: "false",
      }),
      field({
        label: "Max deployments",
        param: "max_deployments",
        type: "number",
        min: "0",
        step: "1",
      }),
      field({
        label: "Max replicas (summed)",
        param: "max_replicas",
        type: "number",
        min: "0",
        step: "1",
        hint: "max_replicas over all its deployments.",
      }),
      field({
        label: "Max GPUs (summed)",
        param: "max_gpus",
        type: "number",
        min: "0",
        step: "1",
        hint: "max_replicas × tensor parallel size over all its deployments.",
      }),
    ),
    field({
      label: "Allowed sources",
      param: "allowed_sources",
      autocomplete: "off",
      spellcheck: "false",
      hint: "Source prefixes it may deploy from, separated by commas; * allows any.",
    }),
    formError(),
    done,
    h(
      "div",
      { class: "actions" },
      h("button", { type: "submit", class: "button primary" }, "Set quota"),
    ),
  );
  const control = (param) => form.querySelector(`[data-param="${param}"]`);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clearErrors(form);
    done.textContent = "";
    const tenant = control("tenant").value.trim();
    if (!tenant) {
      showFieldError(form, "tenant", "Enter the tenant the quota is for.");
      control("tenant").focus();
      return;
    }
    const body = {
      max_deployments: numberOrNull(control("max_deployments")) ?? 0,
      max_replicas: numberOrNull(control("max_replicas")) ?? 0,
      max_gpus: numberOrNull(control("max_gpus")) ?? 0,
      allowed_sources: control("allowed_sources")
        .value.split(",")
        .map((v) => v.trim())
        .filter(Boolean),
    };
    try {
      const q = await ctx.api.put(`/v1/tenants/${encodeURIComponent(tenant)}/quota`, body);
      done.textContent = `Quota of ${q.tenant}: ${q.max_deployments} deployments, ${q.max_replicas} replicas, ${q.max_gpus} GPUs; it uses ${q.use.deployments}, ${q.use.replicas} and ${q.use.gpus}.`;
      await reload();
    } catch (error) {
      showFormError(form, error);
    }
  });
  return form;
}

/** The "Set rate limits" form and the tenants table; `onSet` reloads the keys table. */
export function limitsSection(ctx, onSet) {
  const tenants = h("div", {});
  const done = h("p", { class: "form-ok", role: "status" });
  const submit = h("button", { type: "submit", class: "button primary" }, "Set limits");
  const form = h(
    "form",
    { class: "card", novalidate: true, "aria-labelledby": "limits-title" },
    h("h2", { id: "limits-title" }, "Set rate limits"),
    h(
      "p",
      { class: "hint" },
      "A tenant's limits are shared by all its keys; a key may have its own as well. Both apply. Leave a limit empty for unlimited.",
    ),
    h(
      "div",
      { class: "grid two" },
      field({
        label: "Limits of",
        param: "subject",
        options: [
          { value: "tenant", label: "A tenant" },
          { value: "key", label: "One key" },
        ],
        value: "tenant",
      }),
      field({
        label: "Tenant or key id",
        param: "target",
        required: true,
        autocomplete: "off",
        spellcheck: "false",
        hint: "A tenant name, or a key id such as key_…",
      }),
      field({
        label: "Requests per minute",
        param: "requests_per_minute",
        type: "number",
        min: "1",
        step: "1",
      }),
      field({
        label: "Tokens per minute",
        param: "tokens_per_minute",
        type: "number",
        min: "1",
        step: "1",
      }),
      field({
        label: "Priority",
        param: "priority",
        options: [
          { value: "", label: "Inherited (a tenant: standard)" },
          { value: "critical", label: "Critical: claimed first" },
          { value: "standard", label: "Standard" },
          { value: "sheddable", label: "Sheddable: refused first under load" },
        ],
        value: "",
      }),
    ),
    formError(),
    done,
    h("div", { class: "actions" }, submit),
  );
  const control = (param) => form.querySelector(`[data-param="${param}"]`);
  const reload = async () => {
    const body = await ctx.api.get("/v1/tenants", { signal: ctx.signal });
    refresh(tenants, body.data, () => tenantsTable(body.data));
  };
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clearErrors(form);
    done.textContent = "";
    const subject = control("subject").value;
    const target = control("target").value.trim();
    if (!target) {
      showFieldError(form, "target", `Enter the ${subject === "key" ? "key id" : "tenant"}.`);
      control("target").focus();
      return;
    }
    const body = {
      requests_per_minute: numberOrNull(control("requests_per_minute")),
      tokens_per_minute: numberOrNull(control("tokens_per_minute")),
      priority: control("priority").value || null,
    };
    const path =
      subject === "key"
        ? `/v1/keys/${encodeURIComponent(target)}/limits`
        : `/v1/tenants/${encodeURIComponent(target)}/limits`;
    submit.disabled = true;
    try {
      const set = await ctx.api.put(path, body);
      done.textContent = `Limits of ${subject} ${target}: ${limitText(set.requests_per_minute)} requests, ${limitText(set.tokens_per_minute)} tokens, priority ${set.priority ?? "inherited"}.`;
      await Promise.all([reload(), onSet()]);
    } catch (error) {
      // The key id or tenant name is the path, not a body field: its errors go there.
      if (error.status === 404 || error.param === "key_id" || error.param === "tenant")
        error.param = "target";
      showFormError(form, error);
    } finally {
      submit.disabled = false;
    }
  });
  return {
    el: h(
      "section",
      { "aria-labelledby": "tenants-title" },
      form,
      quotaForm(ctx, reload),
      h("h2", { id: "tenants-title" }, "Tenants"),
      tenants,
      cliHint(
        "ebb keys limits --tenant TENANT --rpm 600 --tpm 100000 · ebb tenants quota TENANT --max-deployments 2 --allow-source fake:// · ebb tenants",
      ),
    ),
    reload,
  };
}
