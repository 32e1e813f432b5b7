"""The console's pages: ``/console/{try,rules,experiments,health}`` and their static assets.

Each page is a plain HTML file in ``static/`` with its own script; ``common.js`` holds the
navigation, the admin key (kept in the tab's ``sessionStorage``, sent as ``X-API-Key``) and
the fetch helper that turns an error answer into its ``detail``. No CDN, no build step: the
files ship as package data and the browser talks only to this server. Pages are sent with a
Content-Security-Policy that allows nothing but this origin, so a console that tried to reach
the network would fail its own browser tests.

Deliberately left out: server-side rendering (every number comes from the API or
``serving.console.api`` in the browser, so the page shows exactly what the API answers).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from fastapi import APIRouter
from fastapi.responses import FileResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).resolve().parent / "static"
STATIC_PATH = "/console/static"
Page = Literal["try", "rules", "experiments", "health"]
PAGES: tuple[str, ...] = Page.__args__  # type: ignore[attr-defined]
CSP = ("default-src 'self'; img-src 'self' blob: data:; style-src 'self'; script-src 'self'; "
       "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'")

router = APIRouter(prefix="/console", include_in_schema=False)


@router.get("")
async def console_root() -> RedirectResponse:
    return RedirectResponse("/console/try")


@router.get("/{page}")
async def console_page(page: Page) -> FileResponse:
    return FileResponse(STATIC_DIR / f"{page}.html", media_type="text/html",
                        headers={"Content-Security-Policy": CSP, "Cache-Control": "no-cache"})


def static_files() -> StaticFiles:
    """The assets app ``serving.app`` mounts at ``STATIC_PATH``."""
    return StaticFiles(directory=STATIC_DIR)
