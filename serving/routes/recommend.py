"""POST /v1/recommend: validate, run the pipeline on a worker thread, return the answer.

The pipeline is synchronous (numpy, faiss, LightGBM, an LLM); running it in starlette's
threadpool keeps the event loop free for probes and other requests. The answer is the typed
``RecommendResponse`` the service built (and pydantic validated, once), serialised straight to
JSON with the fields that were set (``debug`` only on debug answers); the declared
``response_model`` documents it in the OpenAPI schema.

``debug: true`` needs a key (``serving.deps.RecommendCallDep``: 403 without the admin or debug key).
A request sent with ``X-Recsys-Origin: console`` (the console's "Try a request") is served as
any other but never logged as impressions: an operator trying users out is not an exposure
an experiment should count (``impressions_logged`` is false).
"""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.concurrency import run_in_threadpool

from serving.deps import RecommendCallDep
from serving.schemas import RecommendResponse

router = APIRouter(prefix="/v1", tags=["recommend"])
CONSOLE_ORIGIN = "console"  # the X-Recsys-Origin value of the console's requests

_ERRORS = {
    403: {"description": "debug: true without the admin key or serving.debug_api_key in X-API-Key."},
    413: {"description": "Body larger than serving.max_body_bytes."},
    503: {"description": "Not ready yet, or a fail-closed stage failed (the detail names it)."},
}


@router.post("/recommend", response_model=RecommendResponse, response_model_exclude_unset=True,
             responses=_ERRORS)  # type: ignore[arg-type]
async def recommend(call: RecommendCallDep) -> Response:
    log = call.origin != CONSOLE_ORIGIN
    answer = await run_in_threadpool(call.recommender.respond, call.body, call.request_id, log_impressions=log)
    # built and checked once by the service: serialised as is, not dumped and validated again
    return Response(answer.model_dump_json(exclude_unset=True), media_type="application/json",
                    headers={"X-Request-ID": answer.request_id})
