"""The web console: a static single-page app shipped inside the package, served at /console.

Everything the page needs is in `ebb/console/static/`; nothing is fetched from
elsewhere, and the Content-Security-Policy says so to the browser. The page signs in
with a bearer key kept in the tab's sessionStorage and calls the same /v1 API as
everyone else, so this module only serves files.
"""

from __future__ import annotations

import mimetypes
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, RedirectResponse

from ebb.errors import NotFound

CONSOLE_DIR = Path(__file__).parent / "static"
_SERVED_SUFFIXES = {".html", ".css", ".js", ".svg"}

# Only our own files may run, style or be called; nothing may frame the page (clickjacking).
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    # Revalidate on every load, so a platform upgrade never runs against stale scripts.
    "Cache-Control": "no-cache",
}

router = APIRouter(include_in_schema=False)


def _asset_index() -> dict[str, Path]:
    """Relative path -> file, for every servable file: requests are looked up here, so a
    path can never escape the console directory."""
    return {
        path.relative_to(CONSOLE_DIR).as_posix(): path
        for path in CONSOLE_DIR.rglob("*")
        if path.is_file() and path.suffix in _SERVED_SUFFIXES
    }


_ASSETS = _asset_index()


def _serve(path: Path) -> FileResponse:
    media_type, _ = mimetypes.guess_type(path.name)
    if path.suffix == ".js":
        media_type = "text/javascript"  # module scripts need a JavaScript MIME type
    return FileResponse(path, media_type=media_type, headers=SECURITY_HEADERS)


@router.get("/")
async def root() -> RedirectResponse:
    return RedirectResponse("/console", status_code=307)


@router.get("/console")
async def console_page() -> FileResponse:
    return _serve(_ASSETS["index.html"])


@router.get("/console/{asset:path}")
async def console_asset(asset: str) -> FileResponse:
    path = _ASSETS.get(asset or "index.html")
    if path is None:
        raise NotFound(f"No console file {asset!r}.")
    return _serve(path)
