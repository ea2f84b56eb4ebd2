"""A real browser for the console's tests: Debian's chromium driven by Playwright, headless
and quiet, and a page signed in to the console. Shared by every console test module, so
that one place says how the browser runs here."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from playwright.sync_api import Browser, Page, expect, sync_playwright

CHROMIUM = "/usr/bin/chromium"
# Headless and quiet: no network beyond loopback here, and chromium's background services
# would otherwise keep trying to reach Google.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
WIDE = {"width": 1280, "height": 900}


@contextmanager
def chromium(shots: Path) -> Iterator[Browser]:
    """A launched browser; `shots` (where the module's screenshots go) exists inside."""
    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def console_page(
    browser: Browser,
    base_url: str,
    script_errors: list[str],
    *,
    admin_key: str | None = None,
    viewport: dict[str, int] | None = None,
) -> Iterator[Page]:
    """A page open on the console, signed in with `admin_key` when one is given (and
    checked to be). Every script error the page raises is appended to `script_errors`, for the
    caller to assert on."""
    context = browser.new_context(viewport=viewport or WIDE)  # type: ignore[arg-type]
    try:
        page = context.new_page()
        page.on("pageerror", lambda e: script_errors.append(str(e)))
        page.goto(base_url + "/console")
        if admin_key is not None:
            sign_in(page, admin_key)
            expect(page.get_by_text("Signed in with the admin key")).to_be_visible()
        yield page
    finally:
        context.close()


def sign_in(page: Page, key: str) -> None:
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Sign in").click()
