"""POST /v1/recommend: validate, run the pipeline on a worker thread, return the answer.

The pipeline is synchronous (numpy, faiss, LightGBM, an LLM); running it in starlette's
threadpool keeps the event loop free for probes and other requests. The answer is the typed
``RecommendResponse``: FastAPI validates it against the declared model and serves the fields
that were set (``debug`` only on debug answers).
"""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.concurrency import run_in_threadpool

from serving.deps import RecommendBody, RecommenderDep, RequestIdDep
from serving.schemas import RecommendResponse

router = APIRouter(prefix="/v1", tags=["recommend"])

_ERRORS = {
    413: {"description": "Body larger than serving.max_body_bytes."},
    503: {"description": "Not ready yet, or a fail-closed stage failed (the detail names it)."},
}


@router.post("/recommend", response_model=RecommendResponse, response_model_exclude_unset=True,
             responses=_ERRORS)  # type: ignore[arg-type]
async def recommend(body: RecommendBody, recommender: RecommenderDep, request_id: RequestIdDep,
                    response: Response) -> RecommendResponse:
    answer = await run_in_threadpool(recommender.respond, body, request_id)
    response.headers["X-Request-ID"] = answer.request_id
    return answer
