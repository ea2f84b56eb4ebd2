// Sign in with the admin key or a tenant key; the key is checked before it is kept.

import { clear, field, formError, h } from "../dom.js";

export function render({ main, signIn }) {
  const keyField = field({
    label: "API key",
    param: "key",
    type: "password",
    autocomplete: "off",
    spellcheck: "false",
    required: true,
    hint:
      "The admin key ('ebb up' prints it; it is saved in EBB_HOME/admin_key) or a tenant " +
      "key from 'ebb keys create'. It stays in this browser tab only.",
  });
  const input = keyField.querySelector("input");
  const error = formError();
  const button = h("button", { type: "submit", class: "button primary" }, "Sign in");
  const show = h("input", { type: "checkbox", id: "show-key" });
  show.addEventListener("change", () => {
    input.type = show.checked ? "text" : "password";
  });

  const form = h(
    "form",
    { class: "card signin", novalidate: true, "aria-labelledby": "signin-title" },
    h("h1", { id: "signin-title" }, "Sign in to ebb"),
    h("p", { class: "lede" }, "Deploy, watch and try models on this platform."),
    keyField,
    h("div", { class: "check" }, show, h("label", { for: "show-key" }, "Show key")),
    error,
    h("div", { class: "actions" }, button),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const key = input.value.trim();
    error.textContent = "";
    input.removeAttribute("aria-invalid");
    if (!key) {
      error.textContent = "Enter an API key to sign in.";
      input.focus();
      return;
    }
    button.disabled = true;
    button.textContent = "Checking key…";
    try {
      await signIn(key);
    } catch (e) {
      error.textContent =
        e.status === 401 ? `Sign-in refused: ${e.message}` : `Could not sign in: ${e.message}`;
      input.setAttribute("aria-invalid", "true");
      input.select();
      input.focus();
      button.disabled = false;
      button.textContent = "Sign in";
    }
  });
  clear(main, h("div", { class: "signin-wrap" }, form));
  input.focus();
}
