"""The Ray engine: the same per-batch function as the local engine, in a Ray Data actor pool.

Rows of the Ray dataset are whole tagging batches (chunk, batch number, the batch's item rows),
and ``map_batches`` hands each actor one row at a time (``batch_size=1``). Cutting batches on
the driver, not letting Ray Data re-block items, is what keeps the padded batches, hence the
greedy outputs and pooled states, identical to ``--engine local``. Results stream back in any
order; a chunk is committed (``jobs.tagging.job.write_part``) once all its batches are in,
so a killed Ray run resumes like a local one.

Works on a local instance of ``num_cpus`` CPUs or an existing cluster (``address``), connected
through ``recsys.cluster.ray_session`` like every Ray job here; the cluster's workers need this repo
on their ``PYTHONPATH`` (passed via ``runtime_env``) and the model directory at the same path.

Deliberately left out: autoscaling, GPUs, object-store tuning.
"""

from __future__ import annotations

import json
import pickle
from typing import Any

import numpy as np

from jobs.tagging.generate import Tagger, TaggerSettings
from jobs.tagging.job import TagJob, write_part
from llm_rerank.template import DEFAULT, PromptTemplate
from recsys.cluster import ClusterConfig, ray_session
from recsys.progress import progress_bar


class TaggerActor:
    """Ray Data callable class: loads the tagger once per actor, tags one batch per call."""

    def __init__(self, model_dir: str, schema: dict[str, Any], settings: dict[str, Any],
                 template: dict[str, Any] | None = None) -> None:
        prompt = PromptTemplate.model_validate(template) if template is not None else DEFAULT
        self.tagger = Tagger(model_dir, schema, TaggerSettings(**settings), prompt).load()

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        results = [pickle.dumps(self.tagger.tag_batch(json.loads(rows))) for rows in batch["rows"]]
        return {"chunk": batch["chunk"], "batch": batch["batch"], "results": np.array(results, dtype=object)}


def run_ray(job: TagJob, model_dir: str, schema: dict[str, Any], settings: TaggerSettings, pending: list[int],
            *, address: str | None = None, concurrency: int = 1, num_cpus: int = 2,
            progress: bool = True, template: PromptTemplate = DEFAULT) -> None:
    """Tag the ``pending`` chunks through Ray Data, committing each chunk when complete."""
    import ray  # lazy: heavy optional dependency (ray), only for --engine ray

    with ray_session(ClusterConfig(address=address or f"local:{num_cpus}")):
        batches = {c: job.chunk_batches(c) for c in pending}
        rows = [{"chunk": c, "batch": b, "rows": json.dumps(batch)}
                for c in pending for b, batch in enumerate(batches[c])]
        if not rows:
            return
        per_actor_cpus = max(1, num_cpus // concurrency) if not address else settings.threads or 1
        ds = ray.data.from_items(rows, override_num_blocks=len(rows)).map_batches(
            TaggerActor, fn_constructor_kwargs={"model_dir": model_dir, "schema": schema,
                                                "settings": settings.__dict__, "template": template.model_dump()},
            batch_size=1, concurrency=concurrency, num_cpus=per_actor_cpus)
        received: dict[int, dict[int, list[dict[str, Any]]]] = {c: {} for c in pending}
        done = job.stop - sum(len(b) for c in pending for b in batches[c])
        with progress_bar(total=job.stop, initial=done, desc="tag (ray)", unit="item", enabled=progress) as bar:
            for row in ds.iter_rows():
                chunk, b = int(row["chunk"]), int(row["batch"])
                received[chunk][b] = pickle.loads(row["results"])
                bar.update(len(received[chunk][b]))
                if len(received[chunk]) == len(batches[chunk]):
                    write_part(job, chunk, [r for i in range(len(batches[chunk])) for r in received[chunk].pop(i)])
