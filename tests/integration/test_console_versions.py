"""The console's versions panel in a real browser (Playwright, Debian's chromium) against
the platform on the fake engine: a new version deployed from the deploy form shows up
with 0 % traffic, a canary rollout
started from the panel takes its share once warm, Promote moves it on, and Roll back puts
all traffic back on the first version. Screenshots go to test-output/console-ops/."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect
from support import REPO_ROOT, Platform, deploy, temp_home, wait_until
from support.console import chromium, console_page

from ebb.secrets import new_key as new_secrets_key

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

SHOTS = REPO_ROOT / "test-output" / "console-ops"
NAME = "ver"


@pytest.fixture(scope="module")
def platform() -> Iterator[Platform]:
    p = Platform(
        home=temp_home("ebb-console-versions-"),
        redis_url=None,
        env_extra={"EBB_SECRETS_KEY": new_secrets_key()},  # a version's env is stored sealed
    ).start()
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


def traffic(admin: httpx.Client) -> dict:
    return admin.get(f"/v1/deployments/{NAME}/versions").json()["traffic"]


def test_roll_out_a_canary_promote_it_and_roll_back(page, admin):
    deploy(admin, NAME, source="fake://a?step_ms=2", idle_timeout_s=600, min_replicas=1)
    # Deploying an existing name from the deploy form makes its next version.
    page.evaluate("route => { location.hash = route; }", "#/deploy")
    page.get_by_label("Name", exact=True).fill(NAME)
    page.get_by_label("Source").fill("fake://b?step_ms=2")
    page.get_by_label("Environment variables").fill("APP_GREETING=hello")
    page.get_by_role("button", name="Deploy").click()
    expect(page.get_by_text(f"A new version (v2) of {NAME}")).to_be_visible()
    listed = admin.get(f"/v1/deployments/{NAME}/versions").json()["data"]
    assert [(v["version"], v["source"]) for v in listed] == [
        (1, "fake://a?step_ms=2"),
        (2, "fake://b?step_ms=2"),
    ]
    assert listed[1]["env"] == ["APP_GREETING"]  # the names only, never the value
    page.get_by_role("link", name="Open deployment").click()
    versions = page.get_by_role("region", name="Versions")
    expect(versions.locator('tr[data-key="v2"] td[data-label="Traffic"]')).to_have_text("0%")
    expect(versions.locator('tr[data-key="v1"] td[data-label="Traffic"]')).to_have_text("100%")
    expect(page.locator("[data-rollout]")).to_have_attribute("data-rollout", "none")
    assert "hello" not in page.content()  # the secret left the page with the form

    page.get_by_label("Version", exact=True).select_option("2")
    page.get_by_label("Strategy").select_option("canary")
    page.get_by_label("Canary share (%)").fill("10")
    page.get_by_role("button", name="Roll out", exact=True).click()
    # Warming first (no traffic), then the canary's share once v2 has a ready runner.
    expect(page.locator("[data-rollout]")).to_have_attribute(
        "data-rollout", "running", timeout=60_000
    )
    expect(page.locator("[data-rollout]")).to_contain_text("v2 takes 10%")
    expect(versions.locator('tr[data-key="v2"] td[data-label="Traffic"]')).to_have_text("10%")
    assert traffic(admin) == {"1": 90, "2": 10}
    page.screenshot(path=str(SHOTS / "10-versions-canary.png"), full_page=True)

    page.get_by_role("button", name="Promote", exact=True).click()
    expect(versions.locator('tr[data-key="v2"] td[data-label="Traffic"]')).to_have_text("50%")
    wait_until(lambda: traffic(admin) == {"1": 50, "2": 50}, 10, "the promotion")

    page.get_by_role("button", name="Roll back", exact=True).click()
    dialog = page.get_by_role("dialog", name=f"Roll back {NAME}?")
    expect(dialog).to_contain_text("All traffic returns to v1")
    dialog.get_by_role("button", name="Roll back").click()
    expect(page.locator("[data-rollout]")).to_have_attribute("data-rollout", "rolled_back")
    expect(versions.locator('tr[data-key="v1"] td[data-label="Traffic"]')).to_have_text("100%")
    expect(page.locator("[data-rollout]")).to_contain_text(re.compile("Rolled back"))
    assert traffic(admin)["1"] == 100
    page.screenshot(path=str(SHOTS / "11-versions-rolled-back.png"), full_page=True)
