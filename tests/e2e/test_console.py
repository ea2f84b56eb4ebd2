"""The web console in a real browser (Playwright driving Debian's chromium) against the real
platform: deploy the default model from its source, watch it become ready, chat with it,
watch usage grow, manage keys, and refuse a wrong key. One platform start for the module;
the tests run in order, as one person's session would. Screenshots of every view go to
test-output/console/."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect
from support import REPO_ROOT, Platform, real_engine_platform
from support.console import chromium, console_page, sign_in

from ebb.config import DEFAULT_MODEL_SOURCE

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

SHOTS = REPO_ROOT / "test-output" / "console"
NAME = "smol"
WIDE = {"width": 1280, "height": 800}
NARROW = {"width": 390, "height": 844}
MODEL_READY_S = 300


@pytest.fixture(scope="module")
def platform(default_local_model) -> Iterator[Platform]:
    with real_engine_platform("ebb-console-", EBB_PREWARM="1") as p:
        yield p


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium(SHOTS) as b:
        yield b


@pytest.fixture(scope="module")
def script_errors() -> list[str]:
    return []


@pytest.fixture(scope="module")
def page(browser, platform, script_errors) -> Iterator[Page]:
    with console_page(browser, platform.base_url, script_errors, viewport=WIDE) as p:
        yield p


def shot(page: Page, name: str) -> None:
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def go(page: Page, link: str) -> None:
    page.get_by_role("navigation", name="Main").get_by_role("link", name=link, exact=True).click()
    expect(page.locator("main h1")).to_be_visible()


def open_view(page: Page, route: str) -> None:
    """Goes to a view by its address, as a bookmark would (the key is never part of it)."""
    page.evaluate("route => { location.hash = route; }", f"#/{route}")
    expect(page.locator("main h1")).to_be_visible()


def record_step_states(page: Page) -> None:
    """Keeps every state the deploy progress steps go through in window.stepStates."""
    page.evaluate(
        """() => {
            window.stepStates = [];
            new MutationObserver((records) => {
                for (const r of records) {
                    const step = r.target.dataset && r.target.dataset.step;
                    if (step) window.stepStates.push(`${step}:${r.target.dataset.state}`);
                }
            }).observe(document.querySelector("main"),
                       {subtree: true, attributes: true, attributeFilter: ["data-state"]});
        }"""
    )


def unlabelled_controls(page: Page) -> list[str]:
    return page.evaluate(
        """() => [...document.querySelectorAll('input, select, textarea')]
            .filter(el => !el.labels.length && !el.getAttribute('aria-label'))
            .map(el => el.outerHTML)"""
    )


def test_a_wrong_key_is_refused_with_a_clear_message(page):
    expect(page.get_by_role("heading", name="Sign in to ebb", exact=True)).to_be_visible()
    shot(page, "01-sign-in")
    sign_in(page, "ebb-sk-not-a-real-key")
    expect(page.get_by_role("alert")).to_contain_text(
        "Sign-in refused: Incorrect or revoked API key."
    )
    expect(page.get_by_label("API key")).to_have_attribute("aria-invalid", "true")
    expect(page.get_by_role("navigation", name="Main")).to_be_hidden()
    assert page.evaluate("sessionStorage.length") == 0
    shot(page, "02-wrong-key")


def test_sign_in_keeps_the_key_in_this_tab_only(page, platform):
    sign_in(page, platform.admin_key)
    expect(page.get_by_role("heading", name="Deployments", exact=True)).to_be_visible()
    expect(page.get_by_text("No deployments yet")).to_be_visible()
    expect(page.get_by_text("Signed in with the admin key")).to_be_visible()
    assert platform.admin_key not in page.url
    assert page.evaluate("Object.values(sessionStorage)").count(platform.admin_key) == 1
    assert page.evaluate("localStorage.length") == 0 and page.evaluate("document.cookie") == ""
    shot(page, "03-deployments-empty")


def test_deploy_the_default_model_and_watch_it_become_ready(page, admin):
    go(page, "Deploy")
    page.get_by_label("Name").fill(NAME)
    page.get_by_label("Source").fill(DEFAULT_MODEL_SOURCE)
    page.get_by_label("Min replicas").fill("2")
    page.get_by_label("Max replicas").fill("1")
    page.get_by_role("button", name="Deploy").click()
    # The platform's validation error lands next to the field that caused it.
    min_field = page.locator(".field", has=page.get_by_label("Min replicas"))
    expect(min_field.locator(".field-error")).to_have_text(
        "min_replicas (2) must not exceed max_replicas (1)."
    )
    expect(page.get_by_label("Min replicas")).to_be_focused()
    assert admin.get(f"/v1/deployments/{NAME}").status_code == 404
    shot(page, "04-deploy-invalid")

    page.get_by_label("Min replicas").fill("1")
    # An engine option this platform cannot honour: its error lands next to it too.
    page.get_by_label("Quantization").fill("fp7")
    page.get_by_role("button", name="Deploy").click()
    quantization = page.locator(".field", has=page.get_by_label("Quantization"))
    expect(quantization.locator(".field-error")).to_contain_text("is not supported on this")
    assert admin.get(f"/v1/deployments/{NAME}").status_code == 404

    page.get_by_label("Quantization").fill("")
    page.get_by_label("Max sequences").fill("32")
    page.get_by_label("Idle timeout (s)").fill("900")
    record_step_states(page)
    page.get_by_role("button", name="Deploy").click()
    cold_start = page.locator('[data-step="cold-start"]')
    expect(cold_start).to_have_attribute("data-state", re.compile("active|done"))
    shot(page, "05-deploy-progress")
    weights = page.locator('[data-step="weights"]')
    expect(weights).to_have_attribute("data-state", "done", timeout=MODEL_READY_S * 1000)
    expect(weights).to_contain_text("in the cache")
    expect(cold_start).to_have_attribute("data-state", "done", timeout=MODEL_READY_S * 1000)
    # Watched as it happened: the page showed the runner starting before it was ready.
    states = page.evaluate("window.stepStates")
    assert "cold-start:active" in states, states
    assert states.index("cold-start:active") < states.index("cold-start:done")
    expect(cold_start).to_contain_text(re.compile(r"is ready via \w+ in [\d.]+ m?s"))
    expect(page.get_by_role("heading", name=f"{NAME} is ready", exact=True)).to_be_visible()
    shot(page, "06-deploy-ready")
    created = admin.get(f"/v1/deployments/{NAME}").json()
    assert created["status"] == "ready"
    assert created["engine"]["max_num_seqs"] == 32  # the form's engine options were sent


def test_deployments_list_shows_replicas_by_state(page):
    go(page, "Deployments")
    row = page.locator(f'tr[data-key="{NAME}"]')
    expect(row.locator('td[data-label="Status"]')).to_contain_text("Ready")
    expect(row.locator('td[data-label="Ready"]')).to_have_text("1")
    expect(row.locator('td[data-label="Queue"]')).to_have_text("0")
    expect(row.locator('td[data-label="Cold start"]')).to_contain_text(re.compile(r"\d"))
    # This platform keeps one stem and no fork server; the admin sees both.
    pool = page.locator("[data-pool]")
    expect(pool).to_contain_text("target 1")
    expect(pool).to_contain_text("Fork server: off")
    shot(page, "07-deployments")


def test_detail_shows_runners_with_log_lines_and_scales(page, admin):
    page.get_by_role("link", name=NAME, exact=True).click()
    expect(page.get_by_role("heading", name=NAME, exact=True)).to_be_visible()
    runners = page.locator('.table-wrap[aria-label="Runners"]')
    expect(runners.locator("tbody tr").first).to_contain_text("Ready")
    log = page.locator(".runner-log pre").first
    expect(log).to_be_visible()
    expect(log).to_contain_text(re.compile(r"\d\d:\d\d:\d\d \w+ -> ready"))
    expect(page.get_by_text("No recent errors.")).to_be_visible()
    page.get_by_label("Max replicas").fill("2")
    page.get_by_role("button", name="Scale").click()
    expect(page.get_by_text("Scaled: min 1, max 2")).to_be_visible()
    assert admin.get(f"/v1/deployments/{NAME}").json()["max_replicas"] == 2
    shot(page, "08-detail")


def test_playground_streams_an_answer_with_timing_and_usage(page):
    open_view(page, f"playground/{NAME}")
    expect(page.get_by_label("Model")).to_have_value(NAME)
    page.get_by_label("Temperature").fill("0")
    page.get_by_label("Max tokens").fill("32")
    page.get_by_role("textbox", name="Message").fill("What is the capital of France?")
    page.get_by_role("button", name="Send").click()
    answer = page.locator(".bubble.assistant").last
    expect(answer).to_have_attribute("data-state", "done", timeout=120_000)
    expect(answer).to_contain_text("Paris")
    # Streamed: the answer arrived as several deltas, each written into the page.
    assert int(answer.get_attribute("data-chunks")) > 1
    expect(page.locator('[data-stat="ttft"]')).to_have_text(re.compile(r"^[\d.]+ (ms|s)$"))
    expect(page.locator('[data-stat="completion"]')).to_have_text(re.compile(r"^[1-9]\d*$"))
    expect(page.locator('[data-stat="request"]')).to_have_text(re.compile(r"^chatcmpl-"))
    shot(page, "09-playground")


def test_usage_grows_while_the_view_is_open(page, platform):
    go(page, "Usage")
    completion = page.locator('[data-metric="Completion tokens"]')
    expect(completion).not_to_have_text("0")
    before = int(completion.inner_text().replace(",", ""))
    reply = platform.openai().chat.completions.create(
        model=NAME,
        messages=[{"role": "user", "content": "Name a colour."}],
        max_tokens=8,
        temperature=0,
    )
    after = before + reply.usage.completion_tokens
    expect(completion).to_have_text(f"{after:,}", timeout=30_000)
    expect(page.get_by_role("figure", name="Tokens per day")).to_be_visible()
    usage_row = page.locator(f'tr[data-key="{NAME}"]')
    expect(usage_row.locator('td[data-label="Requests"]')).to_have_text("2")
    shot(page, "10-usage")


def test_create_and_revoke_a_key(page, browser, platform):
    go(page, "Keys")
    page.get_by_label("Tenant", exact=True).fill("acme")
    page.get_by_label("Name (optional)").fill("console-test")
    page.get_by_role("button", name="Create key").click()
    secret_box = page.locator("#new-key-secret")
    expect(secret_box).to_have_value(re.compile(r"^ebb-sk-"))
    secret = secret_box.input_value()
    key_id = page.locator(".callout").get_attribute("data-key-id")
    shot(page, "11-key-created")
    page.get_by_role("button", name="I have stored it").click()
    expect(secret_box).to_have_count(0)
    shown = page.evaluate(
        "s => [...document.querySelectorAll('input')].some(i => i.value === s)", secret
    )
    assert not shown, "the secret must leave the page once dismissed"

    # The tenant signs in elsewhere: it sees deployments, not the admin's views.
    tenant = browser.new_context(viewport=WIDE).new_page()
    tenant.goto(platform.base_url + "/console")
    sign_in(tenant, secret)
    expect(tenant.get_by_text("Signed in with a tenant key")).to_be_visible()
    expect(tenant.locator(f'tr[data-key="{NAME}"]')).to_be_visible()
    nav = tenant.get_by_role("navigation", name="Main")
    expect(nav.get_by_role("link", name="Keys")).to_be_hidden()
    shot(tenant, "12-tenant-deployments")

    row = page.locator(f'tr[data-key="{key_id}"]')
    row.get_by_role("button", name=f"Revoke {key_id}").click()
    dialog = page.get_by_role("dialog", name=f"Revoke {key_id}?")
    expect(dialog).to_be_visible()
    shot(page, "13-revoke-confirm")
    dialog.get_by_role("button", name="Revoke").click()
    expect(row.locator('td[data-label="Status"]')).to_have_text("Revoked")
    shot(page, "14-key-revoked")
    response = httpx.get(
        platform.base_url + "/v1/models", headers={"Authorization": f"Bearer {secret}"}
    )
    assert response.status_code == 401

    # The tenant's open tab is signed out on its next refresh, and told why.
    expect(tenant.get_by_role("heading", name="Sign in to ebb", exact=True)).to_be_visible(
        timeout=15_000
    )
    expect(tenant.get_by_text("Incorrect or revoked API key")).to_be_visible()
    assert tenant.evaluate("sessionStorage.length") == 0
    shot(tenant, "15-tenant-signed-out")
    tenant.context.close()


def test_jobs_view_answers_whether_or_not_the_platform_has_jobs(page):
    go(page, "Jobs")
    unavailable = page.locator('[data-jobs="unavailable"]')
    jobs_table = page.locator('.table-wrap[aria-label="Jobs"]')
    expect(unavailable.or_(jobs_table)).to_be_visible()
    shot(page, "16-jobs")


def test_every_control_is_labelled_and_the_nav_works_by_keyboard(page):
    for link in ("Deployments", "Deploy", "Playground", "Usage", "Keys", "Jobs"):
        go(page, link)
        assert unlabelled_controls(page) == [], link
    go(page, "Deployments")
    # Tab from the top of the page: the skip link is its first stop. (A blur() would leave
    # the browser's starting point wherever focus last was, or, once the live list has
    # re-rendered, anywhere in it.)
    page.locator(".skip-link").focus()
    for _ in range(20):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.getAttribute('href')") == "#/playground":
            break
    else:
        pytest.fail("Tab never reached the nav's Playground link")
    # Enter on that link, focused again first: the live list's re-render can take focus
    # between the last Tab and the key press (seen in full CI runs).
    page.get_by_role("navigation").get_by_role("link", name="Playground").press("Enter")
    expect(page.get_by_role("heading", name="Playground", exact=True)).to_be_focused()


@pytest.mark.parametrize("view", ["deployments", f"deployments/{NAME}", "playground", "usage"])
def test_readable_on_a_narrow_window(page, view):
    page.set_viewport_size(NARROW)
    try:
        open_view(page, view)
        if view == "playground":
            expect(page.get_by_label("Model")).to_be_visible()
        else:  # polled views: wait for their data, not just their frame
            expect(page.locator(".live-stamp")).to_contain_text("updated")
        width = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
        assert width[0] <= width[1], f"{view} scrolls sideways on a narrow window: {width}"
        shot(page, f"17-narrow-{view.replace('/', '-')}")
    finally:
        page.set_viewport_size(WIDE)


def test_delete_asks_first(page, admin):
    open_view(page, f"deployments/{NAME}")
    page.get_by_role("button", name="Delete deployment").click()
    dialog = page.get_by_role("dialog", name=f"Delete {NAME}?")
    expect(dialog.get_by_role("button", name="Cancel")).to_be_focused()
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_be_hidden()
    assert admin.get(f"/v1/deployments/{NAME}").status_code == 200

    page.get_by_role("button", name="Delete deployment").click()
    dialog.get_by_role("button", name="Delete").click()
    expect(page.get_by_text(f"Deleted {NAME}.")).to_be_visible()
    expect(page.get_by_role("heading", name="Deployments", exact=True)).to_be_visible()
    expect(page.locator(f'tr[data-key="{NAME}"]')).to_have_count(0)
    assert admin.get(f"/v1/deployments/{NAME}").status_code == 404
    shot(page, "18-deleted")


def test_no_script_errors(script_errors):
    assert script_errors == []
