"""The operator console: a few browser pages over the API, served by the same app at ``/console``.

``router`` carries the pages (``serving.console.pages``) and the small read-only JSON routes
they need (``serving.console.api``); ``serving.app`` includes it and mounts ``static_files()``
at ``STATIC_PATH``. The pages: Try a request (two users side by side, stage by stage; debug
answers need the admin key, and its requests are never logged as impressions), Rules &
prompts (versions, diff, publish, rollback), Experiments (config and latest analysis) and
Health (readiness, Redis, latency percentiles, cache hit rate, fallbacks).
"""

from __future__ import annotations

from fastapi import APIRouter

from serving.console import api, pages

STATIC_PATH = pages.STATIC_PATH
static_files = pages.static_files

router = APIRouter()
router.include_router(pages.router)
router.include_router(api.router)
