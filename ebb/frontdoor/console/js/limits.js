// Rate limits (admin) on the keys view: per tenant (shared by all its keys) and per key,
// requests and tokens per minute; empty means unlimited. PUT /v1/tenants/T/limits and
// PUT /v1/keys/ID/limits, read back from GET /v1/tenants and GET /v1/keys.

import {
  clearErrors,
  cliHint,
  field,
  fmtInt,
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
    ],
  });
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
    };
    const path =
      subject === "key"
        ? `/v1/keys/${encodeURIComponent(target)}/limits`
        : `/v1/tenants/${encodeURIComponent(target)}/limits`;
    submit.disabled = true;
    try {
      const set = await ctx.api.put(path, body);
      done.textContent = `Limits of ${subject} ${target}: ${limitText(set.requests_per_minute)} requests, ${limitText(set.tokens_per_minute)} tokens.`;
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
      h("h2", { id: "tenants-title" }, "Tenants"),
      tenants,
      cliHint("ebb keys limits --tenant TENANT --rpm 600 --tpm 100000 · ebb keys tenants"),
    ),
    reload,
  };
}
