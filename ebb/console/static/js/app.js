// The console shell: the session (a key kept per browser tab), the hash router, polling.

import { createApi } from "./api.js";
import { clear, h } from "./dom.js";
import * as deploy from "./views/deploy.js";
import * as detail from "./views/detail.js";
import * as deployments from "./views/deployments.js";
import * as jobs from "./views/jobs.js";
import * as keys from "./views/keys.js";
import * as logs from "./views/logs.js";
import * as playground from "./views/playground.js";
import * as signin from "./views/signin.js";
import * as usage from "./views/usage.js";

// sessionStorage: the key lives as long as this tab, is not shared with other tabs, and
// never appears in a URL, a cookie or the browser history.
const KEY_ITEM = "ebb.console.key";
const ROLE_ITEM = "ebb.console.role";

const ROUTES = [
  { pattern: /^deployments$/, view: deployments, nav: "deployments" },
  { pattern: /^deployments\/([^/]+)$/, view: detail, nav: "deployments" },
  { pattern: /^deploy$/, view: deploy, nav: "deploy" },
  { pattern: /^playground(?:\/([^/]+))?$/, view: playground, nav: "playground" },
  { pattern: /^usage$/, view: usage, nav: "usage" },
  { pattern: /^keys$/, view: keys, nav: "keys", admin: true },
  { pattern: /^jobs(?:\/([^/]+))?$/, view: jobs, nav: "jobs" },
  { pattern: /^logs(?:\/([^/]+))?(?:\/([^/]+))?$/, view: logs, nav: "logs" },
];

const main = document.getElementById("main");
const nav = document.getElementById("nav");
const flashBox = document.getElementById("flash");
let session = null;
let current = null; // {controller} of the view on screen
let pendingFlash = ""; // a message that must survive the navigation it causes

function flash(message, tone = "good") {
  clear(flashBox, message ? h("p", { class: `flash-${tone}` }, message) : null);
}

function loadSession() {
  const key = sessionStorage.getItem(KEY_ITEM);
  return key ? { key, role: sessionStorage.getItem(ROLE_ITEM) || "tenant" } : null;
}

/** Checks a key against the platform; resolves to its role or throws the ApiError. */
async function probeKey(key) {
  const api = createApi(key);
  await api.get("/v1/models"); // 401 here: the key is wrong or revoked
  try {
    await api.get("/v1/keys");
    return "admin";
  } catch (error) {
    if (error.status === 403) return "tenant";
    throw error;
  }
}

async function signIn(key) {
  const role = await probeKey(key);
  sessionStorage.setItem(KEY_ITEM, key);
  sessionStorage.setItem(ROLE_ITEM, role);
  session = { key, role };
  flash("");
  route();
}

function signOut(message) {
  sessionStorage.removeItem(KEY_ITEM);
  sessionStorage.removeItem(ROLE_ITEM);
  session = null;
  if (message) flash(message, "bad");
  route();
}

function showChrome() {
  const signedIn = session !== null;
  nav.hidden = !signedIn;
  document.getElementById("session").hidden = !signedIn;
  if (!signedIn) return;
  for (const item of nav.querySelectorAll("[data-admin]")) item.hidden = session.role !== "admin";
  document.getElementById("session-role").textContent =
    session.role === "admin" ? "Signed in with the admin key" : "Signed in with a tenant key";
}

function markNav(name) {
  for (const link of nav.querySelectorAll("a[data-route]")) {
    if (link.dataset.route === name) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
}

/** Runs fn now and every ms while the view is on screen and the tab is visible. */
function poller(signal) {
  return async function every(ms, fn) {
    let timer = null;
    const tick = async () => {
      if (signal.aborted) return;
      if (!document.hidden) {
        try {
          await fn();
        } catch (error) {
          if (error.name !== "AbortError") console.error("console: refresh failed", error);
        }
      }
      if (!signal.aborted) timer = setTimeout(tick, ms);
    };
    signal.addEventListener("abort", () => clearTimeout(timer));
    await tick();
  };
}

function matchRoute(path) {
  for (const r of ROUTES) {
    const m = path.match(r.pattern);
    if (m) return { ...r, params: m.slice(1).map((p) => (p ? decodeURIComponent(p) : p)) };
  }
  return null;
}

function route() {
  current?.controller.abort();
  const controller = new AbortController();
  current = { controller };
  showChrome();
  if (!session) {
    markNav(null);
    document.title = "Sign in · ebb console";
    signin.render({ main, signIn });
    return Promise.resolve();
  }
  const path = location.hash.replace(/^#\/?/, "");
  const match = matchRoute(path);
  if (!match || (match.admin && session.role !== "admin")) {
    location.replace("#/deployments");
    return Promise.resolve();
  }
  markNav(match.nav);
  const key = session.key;
  const api = createApi(key, {
    onUnauthorized: (error) => {
      // Several polls may be refused at once: sign this key out once.
      if (session && session.key === key)
        signOut(`The platform refused this key: ${error.message}`);
    },
  });
  const ctx = {
    main,
    api,
    session,
    params: match.params,
    signal: controller.signal,
    every: poller(controller.signal),
    flash,
    navigate: (hash, message = "") => {
      pendingFlash = message;
      location.hash = hash;
    },
    setTitle: (title) => {
      document.title = `${title} · ebb console`;
    },
  };
  clear(main);
  return match.view.render(ctx).catch((error) => {
    if (error.name === "AbortError" || controller.signal.aborted) return;
    clear(
      main,
      h("h1", { tabindex: "-1" }, "Something went wrong"),
      h("p", { class: "error" }, error.message),
    );
  });
}

function focusHeading() {
  // Move focus to the new view's heading so keyboard and screen-reader users land there.
  const heading = main.querySelector("h1");
  if (heading) {
    heading.setAttribute("tabindex", "-1");
    heading.focus({ preventScroll: true });
  }
}

window.addEventListener("hashchange", () => {
  if (!location.hash.startsWith("#/")) return; // in-page anchors are not routes
  flash(pendingFlash);
  pendingFlash = "";
  route().then(focusHeading);
});

document.querySelector(".skip-link").addEventListener("click", (event) => {
  event.preventDefault();
  (main.querySelector("h1") || main).focus();
});

document.getElementById("sign-out").addEventListener("click", () => signOut(""));

session = loadSession();
if (session) {
  // Re-check the stored key: it may have been revoked since this tab signed in.
  probeKey(session.key)
    .then((role) => {
      session.role = role;
      sessionStorage.setItem(ROLE_ITEM, role);
      route();
    })
    .catch((error) => (error.status === 401 ? signOut(error.message) : route()));
} else {
  route();
}
