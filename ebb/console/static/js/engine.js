// The deploy form's engine options (the API's `engine` object): each left empty keeps the
// platform's choice. Fields carry the API's names (`engine.dtype`, ...), so a 400 from the
// platform lands next to the field it is about.

import { field, h, numberOrNull } from "./dom.js";

const CHOICE = [
  { value: "", label: "platform default" },
  { value: "true", label: "on" },
  { value: "false", label: "off" },
];

const TEXT = [
  { param: "dtype", label: "Data type", hint: "auto, float16, bfloat16 or float32." },
  { param: "quantization", label: "Quantization", hint: "awq, gptq, fp8, … (what the platform supports)." },
];

const NUMBERS = [
  { param: "max_num_seqs", label: "Max sequences", hint: "Sequences the engine batches at once." },
  { param: "tensor_parallel_size", label: "Tensor parallel size", hint: "GPUs of one host per runner." },
  { param: "gpu_memory_gib", label: "GPU memory (GiB)", hint: "Instead of the platform's estimate." },
];

const SWITCHES = [
  { param: "enable_prefix_caching", label: "Prefix caching" },
  { param: "enforce_eager", label: "Eager mode", hint: "Off: CUDA graphs (GPUs only)." },
];

export function engineFieldset() {
  return h(
    "fieldset",
    { class: "engine" },
    h("legend", {}, "Engine"),
    h(
      "div",
      { class: "grid three" },
      field({
        label: "Context length",
        param: "max_model_len",
        type: "number",
        min: "16",
        hint: "Tokens; empty: the model's own.",
      }),
      TEXT.map((t) => field({ ...t, param: `engine.${t.param}`, autocomplete: "off" })),
      NUMBERS.map((n) =>
        field({ ...n, param: `engine.${n.param}`, type: "number", min: "0", step: "any" }),
      ),
      SWITCHES.map((s) => field({ ...s, param: `engine.${s.param}`, options: CHOICE, value: "" })),
    ),
  );
}

/** Adds `max_model_len` and the `engine` options typed into the form to `body`. */
export function readEngine(form, body) {
  const control = (param) => form.querySelector(`[data-param="${CSS.escape(param)}"]`);
  const length = numberOrNull(control("max_model_len"));
  if (length !== null) body.max_model_len = length;
  const engine = {};
  for (const { param } of TEXT) {
    const value = control(`engine.${param}`).value.trim();
    if (value) engine[param] = value;
  }
  for (const { param } of NUMBERS) {
    const value = numberOrNull(control(`engine.${param}`));
    if (value !== null) engine[param] = value;
  }
  for (const { param } of SWITCHES) {
    const value = control(`engine.${param}`).value;
    if (value) engine[param] = value === "true";
  }
  if (Object.keys(engine).length) body.engine = engine;
}
