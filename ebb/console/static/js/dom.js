// Small DOM helpers: element builders, labelled form fields, tables and formatting.
// Everything is built with createElement/textContent: API data never becomes markup.

let nextId = 0;

export function uid(prefix = "f") {
  nextId += 1;
  return `${prefix}-${nextId}`;
}

function appendChildren(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
}

function setAttrs(el, attrs) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") el.setAttribute("class", value);
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key === "text") el.textContent = value;
    else if (key.startsWith("on") && typeof value === "function") {
      el.addEventListener(key.slice(2), value);
    } else el.setAttribute(key, value === true ? "" : String(value));
  }
}

/** h("p", {class: "x"}, "text", child...) -> HTMLElement */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  appendChildren(el, children);
  return el;
}

const SVG_NS = "http://www.w3.org/2000/svg";

export function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  setAttrs(el, attrs);
  appendChildren(el, children);
  return el;
}

export function clear(el, ...children) {
  el.replaceChildren();
  appendChildren(el, children);
  return el;
}

// --- formatting -------------------------------------------------------------------------

const intFormat = new Intl.NumberFormat("en-US");

export function fmtInt(n) {
  return n === null || n === undefined ? "—" : intFormat.format(Math.round(n));
}

export function fmtMs(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return "—";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(1)} s`;
  return `${Math.floor(ms / 60_000)} min ${Math.round((ms % 60_000) / 1000)} s`;
}

export function fmtSeconds(s) {
  return s === null || s === undefined ? "—" : fmtMs(s * 1000);
}

/** Money arrives in integer micro-units (1e-6 of the currency unit), never floats. */
export function fmtMicros(micros) {
  if (micros === null || micros === undefined) return "—";
  const units = micros / 1e6;
  const digits = units !== 0 && Math.abs(units) < 1 ? 4 : 2;
  return `$${units.toFixed(digits)}`;
}

export function fmtTime(epochS) {
  if (!epochS) return "—";
  return new Date(epochS * 1000).toLocaleString("en-GB", {
    year: "numeric",
    month: "short",
    day: "numeric",
    hour: "2-digit",
    minute: "2-digit",
  });
}

/** A wall-clock time of day (epoch ms); absolute, so it never goes stale on screen. */
export function fmtClock(epochMs) {
  return epochMs ? new Date(epochMs).toLocaleTimeString("en-GB") : "—";
}

// --- building blocks ---------------------------------------------------------------------

const STATUS_TONES = {
  ready: "good",
  succeeded: "good",
  active: "good",
  starting: "busy",
  loading: "busy",
  preparing: "busy",
  prewarmed: "busy",
  running: "busy",
  queued: "busy",
  draining: "muted",
  sleeping: "muted",
  scaled_to_zero: "muted",
  exited: "muted",
  revoked: "muted",
  cancelled: "muted",
  expired: "muted",
  failing: "bad",
  unschedulable: "bad",
  failed: "bad",
};

export function badge(status) {
  const words = String(status ?? "unknown").replaceAll("_", " ");
  const label = words.charAt(0).toUpperCase() + words.slice(1);
  return h("span", { class: `badge ${STATUS_TONES[status] || "muted"}` }, label);
}

export function code(text) {
  return h("code", {}, text);
}

/** "Same in the CLI": the console and the CLI use the same words for the same actions. */
export function cliHint(command) {
  return h("p", { class: "cli-hint" }, h("span", {}, "Same in the CLI: "), code(command));
}

export function table({ label, columns: given, rows, empty, rowKey }) {
  const columns = given.filter(Boolean); // a null column is one this data does not have
  const head = h(
    "tr",
    {},
    columns.map((c) => h("th", { scope: "col", class: c.num ? "num" : null }, c.label)),
  );
  const body = rows.map((row) =>
    h(
      "tr",
      { dataset: rowKey ? { key: rowKey(row) } : undefined },
      columns.map((c) =>
        h("td", { class: c.num ? "num" : null, "data-label": c.label }, c.cell(row)),
      ),
    ),
  );
  if (!rows.length && empty) {
    body.push(h("tr", {}, h("td", { colspan: columns.length, class: "empty" }, empty)));
  }
  // A labelled, focusable region: keyboard users can scroll a wide table sideways.
  return h(
    "div",
    { class: "table-wrap", role: "region", "aria-label": label, tabindex: "0" },
    h(
      "table",
      {},
      h("caption", { class: "visually-hidden" }, label),
      h("thead", {}, head),
      h("tbody", {}, body),
    ),
  );
}

/**
 * A labelled input with a hint and an error slot that `showFieldError` fills.
 * `param` is the API's name for the field: server validation errors land next to it.
 */
export function field({ label, param, type = "text", value, hint, textarea, options, ...rest }) {
  const id = uid(param || "field");
  const hintId = hint ? `${id}-hint` : null;
  const errorId = `${id}-error`;
  const common = {
    id,
    name: param,
    "aria-describedby": [hintId, errorId].filter(Boolean).join(" "),
    dataset: { param },
    ...rest,
  };
  let control;
  if (options) {
    control = h(
      "select",
      common,
      options.map((o) => h("option", { value: o.value, selected: o.value === value }, o.label)),
    );
  } else if (textarea) {
    control = h("textarea", common);
    control.value = value ?? "";
  } else {
    control = h("input", { type, ...common });
    if (value !== undefined && value !== null) control.value = value;
  }
  return h(
    "div",
    { class: "field" },
    h("label", { for: id }, label),
    control,
    hint ? h("p", { class: "hint", id: hintId }, hint) : null,
    h("p", { class: "field-error", id: errorId, "aria-live": "polite" }),
  );
}

export function clearErrors(form) {
  for (const el of form.querySelectorAll(".field-error")) el.textContent = "";
  for (const el of form.querySelectorAll("[aria-invalid]")) el.removeAttribute("aria-invalid");
  const alert = form.querySelector(".form-error");
  if (alert) alert.textContent = "";
}

/** Put `message` next to the field named `param`; false when the form has no such field. */
export function showFieldError(form, param, message) {
  const control = param && form.querySelector(`[data-param="${CSS.escape(param)}"]`);
  if (!control) return false;
  control.setAttribute("aria-invalid", "true");
  const slot = control.closest(".field").querySelector(".field-error");
  slot.textContent = message;
  return true;
}

/** Shows an API error on a form: next to its field when the API named one, else on top. */
export function showFormError(form, error) {
  if (showFieldError(form, error.param, error.message)) {
    form.querySelector("[aria-invalid]")?.focus();
    return;
  }
  const alert = form.querySelector(".form-error");
  alert.textContent = error.message;
}

export function formError() {
  return h("p", { class: "form-error", role: "alert" });
}

export function numberOrNull(input) {
  const text = input.value.trim();
  return text === "" ? null : Number(text);
}

/** "Live · updated 12:00:03" under a polled view; a failed refresh is announced once. */
export function liveLine() {
  const stamp = h("span", { class: "live-stamp" }, "Loading…");
  const problem = h("span", { class: "live-problem", role: "alert" });
  const el = h(
    "p",
    { class: "live" },
    h("span", { class: "live-dot", "aria-hidden": "true" }),
    stamp,
    problem,
  );
  return {
    el,
    ok() {
      el.classList.remove("stale");
      stamp.textContent = `Live · updated ${new Date().toLocaleTimeString("en-GB")}`;
      if (problem.textContent) problem.textContent = "";
    },
    fail(error) {
      el.classList.add("stale");
      const text = ` Not refreshing: ${error.message} Retrying…`;
      if (problem.textContent !== text) problem.textContent = text;
    },
  };
}

const shown = new WeakMap();

function focusKey(el) {
  return (
    el.getAttribute("href") || el.getAttribute("aria-label") || el.dataset.param || el.id || null
  );
}

/**
 * Re-renders `container` from `build()` when `data` changed since the last call, keeping
 * keyboard focus on the equivalent element: polling must not yank focus away.
 */
export function refresh(container, data, build) {
  const signature = JSON.stringify(data);
  if (shown.get(container) === signature) return;
  shown.set(container, signature);
  const active = container.contains(document.activeElement)
    ? focusKey(document.activeElement)
    : null;
  clear(container, build());
  if (active) {
    const again = [
      ...container.querySelectorAll("a, button, input, select, textarea, summary, [tabindex]"),
    ].find((el) => focusKey(el) === active);
    again?.focus({ preventScroll: true });
  }
}

/** A modal confirmation; resolves true when confirmed. Escape or Cancel resolve false. */
export function confirmDialog({ title, message, confirmLabel }) {
  const opener = document.activeElement;
  return new Promise((resolve) => {
    const titleId = uid("dialog");
    const cancel = h("button", { type: "button", class: "button", value: "cancel" }, "Cancel");
    const confirm = h(
      "button",
      { type: "button", class: "button danger", value: "confirm" },
      confirmLabel,
    );
    const dialog = h(
      "dialog",
      { class: "dialog", "aria-labelledby": titleId },
      h("h2", { id: titleId }, title),
      h("p", {}, message),
      h("div", { class: "actions" }, cancel, confirm),
    );
    cancel.addEventListener("click", () => dialog.close("cancel"));
    confirm.addEventListener("click", () => dialog.close("confirm"));
    dialog.addEventListener("close", () => {
      dialog.remove();
      opener?.focus?.();
      resolve(dialog.returnValue === "confirm");
    });
    document.body.append(dialog);
    dialog.showModal();
    cancel.focus(); // the safe choice has focus: Enter does not destroy anything
  });
}
