// The caller's webhook signing secret (GET /v1/webhooks/secret) and its rotation
// (POST /v1/webhooks/secret/rotate): after a rotation deliveries are signed with the old
// secret too until the overlap ends, so receivers switch without rejecting any.

import { cliHint, confirmDialog, field, fmtTime, h, numberOrNull } from "./dom.js";

export function webhookSecretSection(ctx) {
  const secret = h("input", {
    type: "password",
    readonly: true,
    id: "webhook-secret",
    class: "secret",
    spellcheck: "false",
  });
  const reveal = h("button", { type: "button", class: "button" }, "Show");
  const facts = h("p", { class: "hint", dataset: { secretFacts: "" } });
  const overlap = field({
    label: "Old secret stays valid for (s)",
    param: "overlap_s",
    type: "number",
    min: "0",
    step: "any",
    hint: "Empty: the platform's default overlap.",
  });
  const rotate = h("button", { type: "button", class: "button danger" }, "Rotate secret");
  const done = h("p", { class: "form-ok", role: "status" });
  const show = (s) => {
    secret.value = s.secret;
    secret.dataset.rotatedAt = String(s.rotated_at ?? "");
    facts.textContent =
      (s.rotated_at ? `Rotated ${fmtTime(s.rotated_at)}.` : "Never rotated.") +
      (s.previous_secret_expires_at
        ? ` The previous secret is still accepted until ${fmtTime(s.previous_secret_expires_at)}.`
        : "");
  };
  reveal.addEventListener("click", () => {
    const hidden = secret.type === "password";
    secret.type = hidden ? "text" : "password";
    reveal.textContent = hidden ? "Hide" : "Show";
  });
  rotate.addEventListener("click", async () => {
    const sure = await confirmDialog({
      title: "Rotate the webhook secret?",
      message:
        "New deliveries are signed with a new secret. The current one keeps being accepted until the overlap ends; update your receivers before then.",
      confirmLabel: "Rotate",
    });
    if (!sure) return;
    const seconds = numberOrNull(overlap.querySelector("input"));
    try {
      const body = seconds === null ? {} : { overlap_s: seconds };
      show(await ctx.api.post("/v1/webhooks/secret/rotate", body));
      done.textContent = "Rotated: deliveries are signed with the new secret from now on.";
    } catch (error) {
      done.textContent = "";
      ctx.flash(error.message, "bad");
    }
  });
  const el = h(
    "section",
    { class: "card", "aria-labelledby": "webhook-secret-title" },
    h("h2", { id: "webhook-secret-title" }, "Webhook signing secret"),
    h(
      "p",
      { class: "hint" },
      "Every webhook delivery to your tenant carries a signature made with this secret.",
    ),
    h(
      "div",
      { class: "field" },
      h("label", { for: "webhook-secret" }, "Current secret"),
      h("div", { class: "row" }, secret, reveal),
    ),
    facts,
    overlap,
    done,
    h("div", { class: "actions" }, rotate),
    cliHint("ebb jobs secret · ebb jobs secret --rotate --overlap SECONDS"),
  );
  return {
    el,
    async load() {
      show(await ctx.api.get("/v1/webhooks/secret", { signal: ctx.signal }));
    },
  };
}
