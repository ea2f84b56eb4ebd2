"""The console's static files: served from the package with a strict CSP, nothing external,
no path out of the console directory, every module import resolvable."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from ebb.config import Settings
from ebb.console.routes import CONSOLE_DIR
from ebb.frontdoor.app import create_app

ASSETS = sorted(p for p in CONSOLE_DIR.rglob("*") if p.is_file())
# The one absolute URL the page may spell: SVG's namespace, an identifier never fetched.
SVG_NAMESPACE = "http://www.w3.org/2000/svg"


@pytest.fixture(scope="module")
def client():
    # Without a `with` block the lifespan (Redis, services) never starts: the console's
    # routes need none of it.
    return TestClient(create_app(Settings()))


def test_console_page_is_served_with_a_strict_policy(client):
    response = client.get("/console")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    policy = response.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "connect-src 'self'" in policy
    assert "frame-ancestors 'none'" in policy
    assert response.headers["x-content-type-options"] == "nosniff"
    assert client.get("/", follow_redirects=False).headers["location"] == "/console"


def test_every_file_the_page_references_is_served(client):
    page = client.get("/console").text
    referenced = re.findall(r'(?:src|href)="(/console/[^"]+)"', page)
    assert referenced, "the page must load its stylesheet and script from /console/"
    for url in referenced:
        response = client.get(url)
        assert response.status_code == 200, url
    script = client.get("/console/js/app.js")
    assert script.headers["content-type"].startswith("text/javascript")


def test_module_imports_resolve_to_shipped_files():
    for path in CONSOLE_DIR.rglob("*.js"):
        for target in re.findall(r'from "(\.{1,2}/[^"]+)"', path.read_text()):
            assert (path.parent / target).resolve().is_file(), f"{path.name} imports {target}"


@pytest.mark.parametrize("path", ASSETS, ids=lambda p: p.name)
def test_no_asset_reaches_outside_the_platform(path):
    text = path.read_text().replace(SVG_NAMESPACE, "")
    assert not re.search(r"https?://|//[a-z0-9.-]+\.(com|net|org|io)\b", text), (
        f"{path.name} refers to an external URL: the console must work with no network"
    )


def test_paths_outside_the_console_are_not_served(client):
    for path in ("/console/../pyproject.toml", "/console/%2e%2e/routes.py", "/console/x"):
        response = client.get(path)
        assert response.status_code == 404, path
        assert "error" in response.json()
