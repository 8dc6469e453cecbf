"""The web dashboard: static HTML, JS and CSS that the API serves, no build step.

``add_routes(app)`` serves ``/`` and ``/dashboard`` (redirects) and
``/dashboard/<file>`` from this directory, with a Content-Security-Policy that
lets the page run only its own script and talk only to its own origin. The
files need no API key; the page asks for one and sends it as a header
(see ``app.js``).
"""

from __future__ import annotations

import re
from pathlib import Path

from aiohttp import web

DIRECTORY = Path(__file__).resolve().parent
_FILE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}\.(?:html|js|css|svg|png|ico)$")
# Results may be presigned URLs on another origin (S3, MinIO): images and media from http(s).
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data: https: http:; "
    "media-src 'self' https: http:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def add_routes(app: web.Application, directory: Path = DIRECTORY) -> None:
    async def redirect(request: web.Request) -> web.Response:
        """The dashboard's address."""
        raise web.HTTPFound("/dashboard/")

    async def static_file(request: web.Request) -> web.StreamResponse:
        """A file of the dashboard."""
        name = request.match_info.get("name") or "index.html"
        path = directory / name
        if not _FILE.match(name) or not path.is_file():
            raise web.HTTPNotFound(reason=f"no dashboard file {name!r}")
        return web.FileResponse(path, headers=HEADERS)

    app.router.add_get("/", redirect)
    app.router.add_get("/dashboard", redirect)
    app.router.add_get("/dashboard/", static_file)
    app.router.add_get("/dashboard/{name}", static_file)
