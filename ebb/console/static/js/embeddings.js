// The playground for an embedding (pooling) deployment: embed a few inputs and see each
// vector's size, norm and first values, with the request's prompt tokens and time.

import { clearErrors, field, fmtInt, fmtMs, formError, h, numberOrNull, showFormError, table } from "./dom.js";

function norm(vector) {
  return Math.sqrt(vector.reduce((sum, x) => sum + x * x, 0));
}

function resultsTable(inputs, reply) {
  return table({
    label: "Embeddings",
    rows: reply.data.map((d) => ({ ...d, input: inputs[d.index] })),
    rowKey: (r) => String(r.index),
    columns: [
      { label: "#", num: true, cell: (r) => String(r.index) },
      { label: "Input", cell: (r) => r.input },
      { label: "Dimensions", num: true, cell: (r) => fmtInt(r.embedding.length) },
      { label: "Norm", num: true, cell: (r) => norm(r.embedding).toFixed(4) },
      {
        label: "First values",
        cell: (r) =>
          h(
            "code",
            {},
            `${r.embedding
              .slice(0, 4)
              .map((x) => x.toFixed(4))
              .join(", ")}${r.embedding.length > 4 ? ", …" : ""}`,
          ),
      },
    ],
  });
}

/** {panel, aside}: the inputs form with its results, and the last request's figures. */
export function embeddingsPlayground(ctx, model) {
  const inputs = field({
    label: "Inputs",
    param: "input",
    textarea: true,
    rows: "4",
    hint: "One input per line; each line is embedded separately.",
  });
  const dimensions = field({
    label: "Dimensions (optional)",
    param: "dimensions",
    type: "number",
    min: "1",
    step: "1",
    hint: "Fewer dimensions, where the model supports it.",
  });
  const submit = h("button", { type: "submit", class: "button primary" }, "Embed");
  const results = h("div", { class: "embeddings-results", "aria-live": "polite" });
  const stats = {
    prompt: h("dd", { dataset: { stat: "prompt" } }, "—"),
    total: h("dd", { dataset: { stat: "total" } }, "—"),
    vectors: h("dd", { dataset: { stat: "vectors" } }, "—"),
  };
  const form = h(
    "form",
    { class: "chat-form", novalidate: true, "aria-label": "Embed inputs" },
    inputs,
    dimensions,
    formError(),
    h("div", { class: "actions" }, submit),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clearErrors(form);
    const lines = inputs
      .querySelector("textarea")
      .value.split("\n")
      .map((l) => l.trim())
      .filter(Boolean);
    if (!lines.length) {
      showFormError(form, { param: "input", message: "Write at least one input line." });
      return;
    }
    const body = { model, input: lines, encoding_format: "float" };
    const dims = numberOrNull(dimensions.querySelector("input"));
    if (dims !== null) body.dimensions = dims;
    submit.disabled = true;
    const started = performance.now();
    try {
      const reply = await ctx.api.post("/v1/embeddings", body, { signal: ctx.signal });
      stats.total.textContent = fmtMs(performance.now() - started);
      stats.prompt.textContent = fmtInt(reply.usage?.prompt_tokens);
      stats.vectors.textContent = fmtInt(reply.data.length);
      results.replaceChildren(resultsTable(lines, reply));
    } catch (error) {
      if (error.name === "AbortError") return;
      showFormError(form, error);
    } finally {
      submit.disabled = false;
    }
  });
  const labels = { prompt: "Prompt tokens", total: "Total time", vectors: "Vectors" };
  return {
    panel: h(
      "section",
      { class: "card chat", "aria-label": "Embeddings", dataset: { mode: "embeddings" } },
      form,
      results,
    ),
    aside: [
      h("p", { class: "hint" }, `${model} is an embedding model: it answers /v1/embeddings.`),
      h("h2", {}, "Last request"),
      h(
        "dl",
        { class: "stats-list" },
        Object.entries(stats).map(([k, dd]) => h("div", {}, h("dt", {}, labels[k]), dd)),
      ),
    ],
  };
}
