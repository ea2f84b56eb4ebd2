"""The console's deploy form for LoRA adapters in a real browser (Playwright, Debian's
chromium) against the platform on the fake engine: a bad base is refused next to the Base
deployment field, a good one deploys the adapter (the API has it with `base`), the panel
says it loads into the base's runner on its first request instead of waiting on weights
and a cold start, and the list and the detail view show its base. Screenshots go to
test-output/console-ops/."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect
from support import REPO_ROOT, Platform, deploy, temp_home
from support.console import chromium, console_page
from support.lora import write_adapter

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

SHOTS = REPO_ROOT / "test-output" / "console-ops"
BASE = "cadapter-base"
ADAPTER = "cadapter-one"


@pytest.fixture(scope="module")
def platform() -> Iterator[Platform]:
    p = Platform(home=temp_home("ebb-console-adapters-"), redis_url=None).start()
    yield p
    assert p.stop() == 0


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium(SHOTS) as b:
        yield b


@pytest.fixture(scope="module")
def page(browser, platform) -> Iterator[Page]:
    errors: list[str] = []
    with console_page(browser, platform.base_url, errors, admin_key=platform.admin_key) as p:
        yield p
    assert errors == []


def open_deploy_form(page: Page) -> None:
    page.evaluate("route => { location.hash = route; }", "#/deploy")
    expect(page.get_by_label("Base deployment")).to_be_visible()


def test_an_adapter_deployed_from_the_form_names_its_base(page, admin, tmp_path):
    deploy(admin, BASE, "fake://cb", idle_timeout_s=600, engine={"enable_lora": True})
    source = str(write_adapter(tmp_path / "adapter"))
    open_deploy_form(page)
    # Only deployments that can be a base are suggested, and the field is labelled.
    assert page.evaluate(
        "[...document.querySelectorAll('#known-bases option')].map(o => o.value)"
    ) == [BASE]
    assert page.locator('[data-param="base"]').count() == 1  # not again under More options

    # A base that does not exist: the API's 400 lands next to the field.
    page.get_by_label("Name", exact=True).fill(ADAPTER)
    page.get_by_label("Source").fill(source)
    page.get_by_label("Base deployment").fill("no-such-base")
    page.get_by_role("button", name="Deploy").click()
    base_field = page.locator(".field", has=page.get_by_label("Base deployment"))
    expect(base_field.locator(".field-error")).to_contain_text("no-such-base")
    expect(page.get_by_label("Base deployment")).to_have_attribute("aria-invalid", "true")
    assert admin.get(f"/v1/deployments/{ADAPTER}").status_code == 404

    page.get_by_label("Base deployment").fill(BASE)
    page.get_by_role("button", name="Deploy").click()
    panel = page.get_by_role("region", name=f"{ADAPTER} is registered")
    expect(panel).to_contain_text(f"Registered as a LoRA adapter of {BASE}")
    expect(panel).to_contain_text(f"loads into {BASE}'s runner on its first request")
    expect(panel.locator('[data-step="weights"], [data-step="cold-start"]')).to_have_count(0)
    expect(page.locator("main .cli-hint")).to_contain_text(f"--base {BASE}")
    created = admin.get(f"/v1/deployments/{ADAPTER}").json()
    assert (created["base"], created["source"]) == (BASE, source)
    models = {m["id"]: m for m in admin.get("/v1/models").json()["data"]}
    assert models[ADAPTER]["parent"] == BASE
    page.screenshot(path=str(SHOTS / "20-adapter-deployed.png"), full_page=True)

    page.get_by_role("link", name="Open deployment").click()
    expect(page.locator("p.meta").first).to_contain_text(f"LoRA adapter of {BASE}")
    expect(page.locator(f'p.meta a[data-base="{BASE}"]')).to_have_attribute(
        "href", f"#/deployments/{BASE}"
    )

    page.evaluate("route => { location.hash = route; }", "#/deployments")
    row = page.locator(f'tr[data-key="{ADAPTER}"]')
    expect(row).to_contain_text(f"adapter of {BASE}")
    expect(page.locator(f'tr[data-key="{BASE}"]')).not_to_contain_text("adapter of")
    page.screenshot(path=str(SHOTS / "21-adapter-listed.png"), full_page=True)
