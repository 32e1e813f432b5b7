"""Reasons precomputed into the serving Redis (``recsys tag explanations``).

``precompute_reasons`` answers each user's request with ``explain`` through the serving path,
online: the reasons land in the serving Redis under the keys requests read
(``llm_rerank.reason_cache``), so a deployment serves them from cache without waiting for the model.

Deliberately left out: writing and checking reasons (``llm_rerank.explain``), measuring them
(``bench.explanations``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cascade.settings import Settings
from offline.split import Split
from serving.online_backend import OnlineBackend
from serving.schemas import RecommendRequest
from serving.service import Recommender


def precompute_reasons(settings: Settings, artifact_dir: Path, *, users: Sequence[str] | None = None,
                       k: int = 10, explain_k: int | None = None) -> dict[str, Any]:
    """Write reasons for each user's current top ``explain_k`` items into the serving Redis (module
    docstring); ``users`` default every user of the split. The report counts them."""
    backend = OnlineBackend.open(settings, Path(artifact_dir))
    try:
        rec = Recommender.load(settings, artifact_dir, backend=backend)
        rec.explanations.generator()
        rec.explanations.start_loading(wait=True)
        chosen = list(users) if users is not None else [str(u) for u in Split.load(artifact_dir / "split").vocab.user_ids]
        t0 = time.perf_counter()
        for user in chosen:
            rec.respond(RecommendRequest(user_id=user, k=k, explain=True, explain_k=explain_k), log_impressions=False)
        counts = rec.explanations.writer(rec.online).counts
        return {"users": len(chosen), "reasons": counts["served"], "written_by_llm": counts["llm"],
                "already_cached": counts["cached"], "seconds": round(time.perf_counter() - t0, 1),
                "namespace": backend.ns, "model_error": rec.explanations.load_error}
    finally:
        backend.close()
