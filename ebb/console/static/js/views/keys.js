// API keys (admin): create (the secret is shown once), list, revoke; tenants and the rate
// limits of tenants and keys.

import {
  badge,
  clear,
  clearErrors,
  cliHint,
  confirmDialog,
  field,
  fmtTime,
  formError,
  h,
  refresh,
  showFieldError,
  showFormError,
  table,
} from "../dom.js";
import { limitsSection, limitText } from "../limits.js";

function secretCallout(created, onDone) {
  const input = h("input", {
    type: "text",
    readonly: true,
    id: "new-key-secret",
    class: "secret",
    spellcheck: "false",
  });
  input.value = created.key;
  const copied = h("span", { class: "sub", role: "status" });
  const copy = h("button", { type: "button", class: "button" }, "Copy");
  copy.addEventListener("click", async () => {
    input.select();
    try {
      await navigator.clipboard.writeText(created.key);
      copied.textContent = "Copied.";
    } catch {
      copied.textContent = "Press Ctrl+C to copy the selected key.";
    }
  });
  const done = h("button", { type: "button", class: "button primary" }, "I have stored it");
  done.addEventListener("click", onDone);
  return h(
    "section",
    { class: "card callout", "aria-labelledby": "new-key-title", dataset: { keyId: created.id } },
    h("h2", { id: "new-key-title" }, `New key for tenant ${created.tenant}`),
    h("p", {}, "Copy it now: this is the only time it is shown. The platform keeps only its hash."),
    h(
      "div",
      { class: "field" },
      h("label", { for: "new-key-secret" }, `Secret of ${created.id}`),
      h("div", { class: "row" }, input, copy),
    ),
    copied,
    h("div", { class: "actions" }, done),
  );
}

function keysTable(ctx, keys, reload) {
  const revokeButton = (k) => {
    if (k.revoked) return "";
    const button = h(
      "button",
      { type: "button", class: "button danger small", "aria-label": `Revoke ${k.id}` },
      "Revoke",
    );
    button.addEventListener("click", async () => {
      const sure = await confirmDialog({
        title: `Revoke ${k.id}?`,
        message: `Requests with this key (tenant ${k.tenant}${k.name ? `, “${k.name}”` : ""}) will be refused with 401 at once. This cannot be undone.`,
        confirmLabel: "Revoke",
      });
      if (!sure) return;
      try {
        await ctx.api.del(`/v1/keys/${encodeURIComponent(k.id)}`);
        ctx.flash(`Revoked ${k.id}.`);
        await reload();
      } catch (error) {
        ctx.flash(error.message, "bad");
      }
    });
    return button;
  };
  return table({
    label: "API keys",
    rows: [...keys].reverse(),
    rowKey: (k) => k.id,
    empty: "No keys yet. Create one for each tenant that calls the API.",
    columns: [
      { label: "Id", cell: (k) => h("code", {}, k.id) },
      { label: "Tenant", cell: (k) => k.tenant },
      { label: "Name", cell: (k) => k.name || "—" },
      { label: "Created", cell: (k) => fmtTime(k.created) },
      { label: "Status", cell: (k) => badge(k.revoked ? "revoked" : "active") },
      {
        label: "Limits",
        cell: (k) =>
          k.limits
            ? `${limitText(k.limits.requests_per_minute)} req · ${limitText(k.limits.tokens_per_minute)} tok`
            : "—",
      },
      { label: "Action", cell: revokeButton },
    ],
  });
}

export async function render(ctx) {
  ctx.setTitle("API keys");
  const callout = h("div", {});
  const list = h("div", {});
  const submit = h("button", { type: "submit", class: "button primary" }, "Create key");
  const form = h(
    "form",
    { class: "card", novalidate: true, "aria-labelledby": "create-key-title" },
    h("h2", { id: "create-key-title" }, "Create a key"),
    h(
      "div",
      { class: "grid two" },
      field({
        label: "Tenant",
        param: "tenant",
        required: true,
        autocomplete: "off",
        spellcheck: "false",
        hint: "Who the key's usage is billed to: letters, digits, '.', '_' or '-'.",
      }),
      field({
        label: "Name (optional)",
        param: "name",
        autocomplete: "off",
        hint: "A label to recognise the key by.",
      }),
    ),
    formError(),
    h("div", { class: "actions" }, submit),
  );
  ctx.main.append(
    h("div", { class: "view-head" }, h("h1", {}, "API keys")),
    h(
      "p",
      { class: "lede" },
      "Tenant keys call the API and see their own usage. The admin key is separate and cannot be revoked here.",
    ),
    form,
    callout,
    h("h2", {}, "Keys"),
    list,
    cliHint("ebb keys create --tenant TENANT · ebb keys list · ebb keys revoke KEY_ID"),
  );
  const reloadKeys = async () => {
    const body = await ctx.api.get("/v1/keys", { signal: ctx.signal });
    refresh(list, body.data, () => keysTable(ctx, body.data, reload));
  };
  const limits = limitsSection(ctx, reloadKeys);
  ctx.main.append(limits.el);
  const reload = () => Promise.all([reloadKeys(), limits.reload()]);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clearErrors(form);
    const tenant = form.querySelector('[data-param="tenant"]').value.trim();
    const name = form.querySelector('[data-param="name"]').value.trim();
    if (!tenant) {
      showFieldError(form, "tenant", "Enter the tenant this key belongs to.");
      form.querySelector('[data-param="tenant"]').focus();
      return;
    }
    submit.disabled = true;
    try {
      const created = await ctx.api.post("/v1/keys", { tenant, name });
      form.reset();
      clear(
        callout,
        secretCallout(created, () => {
          clear(callout); // the secret leaves the page for good
          submit.focus();
        }),
      );
      callout.querySelector("input").focus();
      callout.querySelector("input").select();
      await reload();
    } catch (error) {
      showFormError(form, error);
    } finally {
      submit.disabled = false;
    }
  });
  await reload();
}
