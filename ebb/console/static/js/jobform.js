// The jobs view's "Submit a job" form: a chat request run without a client waiting
// (POST /v1/jobs), with an optional webhook for its events.

import { clearErrors, field, formError, h, numberOrNull, showFieldError, showFormError } from "./dom.js";

/** The form; `onSubmitted(job)` runs with the accepted job (202). */
export function jobForm(ctx, models, onSubmitted) {
  const submit = h("button", { type: "submit", class: "button primary" }, "Submit job");
  const form = h(
    "form",
    { class: "card", novalidate: true, "aria-labelledby": "submit-job-title" },
    h("h2", { id: "submit-job-title" }, "Submit a job"),
    h(
      "div",
      { class: "grid two" },
      field({
        label: "Model",
        param: "model",
        options: models.map((m) => ({ value: m, label: m })),
        value: models[0],
      }),
      field({
        label: "Max tokens",
        param: "body.max_tokens",
        type: "number",
        min: "1",
        step: "1",
        value: "64",
      }),
    ),
    field({
      label: "Prompt",
      param: "body.messages",
      textarea: true,
      rows: "3",
      hint: "Sent as one user message of a chat completion.",
    }),
    field({
      label: "Webhook URL (optional)",
      param: "webhook.url",
      inputmode: "url",
      autocomplete: "off",
      spellcheck: "false",
      hint: "Receives job.started and the job's end, signed with your webhook secret.",
    }),
    formError(),
    h("div", { class: "actions" }, submit),
  );
  const control = (param) => form.querySelector(`[data-param="${CSS.escape(param)}"]`);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clearErrors(form);
    const prompt = control("body.messages").value.trim();
    if (!prompt) {
      showFieldError(form, "body.messages", "Write the prompt the job should answer.");
      control("body.messages").focus();
      return;
    }
    const body = { messages: [{ role: "user", content: prompt }] };
    const maxTokens = numberOrNull(control("body.max_tokens"));
    if (maxTokens !== null) body.max_tokens = maxTokens;
    const job = { model: control("model").value, endpoint: "chat.completions", body };
    const url = control("webhook.url").value.trim();
    if (url) job.webhook = { url };
    submit.disabled = true;
    try {
      onSubmitted(await ctx.api.post("/v1/jobs", job, { signal: ctx.signal }));
    } catch (error) {
      if (error.name === "AbortError") return;
      // The API names fields inside the body as body.X; the form's prompt is body.messages.
      if (error.param?.startsWith("body.messages")) error.param = "body.messages";
      showFormError(form, error);
    } finally {
      submit.disabled = false;
    }
  });
  return form;
}
