"""Entry points behind ``recsys tag``: tag a split's catalog, and adapt the tagger first.

``tag_catalog`` builds the concrete schema from the catalog's categories, versions the job,
resumes whatever parts exist, runs the chosen engine, finalises the table and returns the
summary (items, seconds, items/s, schema-valid rate, fallbacks, genre F1 on all items and on
the items held out of adaptation). Layout under ``<artifact_dir>/tags/``: ``parts/``,
``manifest.json``, ``tags.parquet``, ``hidden.npy``, ``version.json``, ``summary.json``;
``adapt_tagger_for`` writes the adapted model to ``tags/model/`` and the held-out item list to
``tags/holdout.json``.

``tag_catalog(prompt=...)`` takes the prompt document the re-ranker serves
(``llm_rerank.template``: ``llm.prompt`` in the config, a file through ``load_prompt_file``, or
the document of an active ``/admin/prompts`` version); its ``tagging_system`` and
``tagging_request`` change what the tagger sees, and the job version with them.

``tag_catalog(method="logits")`` reads the closed fields from label logits and generates only
the free text (``jobs.tagging.logits``), calibrating thresholds on the items outside
``tags/holdout.json`` (written here when absent, with the adaptation job's fraction and seed).

Deliberately left out: embedding training (``jobs.tagging.embed``), wiring into stages
(``jobs.tagging.wiring``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Literal

import numpy as np

from jobs.tagging.adapt import AdaptSettings, adapt_tagger
from jobs.tagging.generate import Tagger, TaggerSettings
from jobs.tagging.job import TagJob, finalize, item_rows, job_version, prepare, run_local, write_part
from jobs.tagging.label_prompt import LABEL_PROMPT_VERSION
from jobs.tagging.logits import LogitTagger, tag_items
from jobs.tagging.quality import genre_f1, holdout_items
from jobs.tagging.ray_engine import run_ray
from jobs.tagging.schema import catalog_categories, concrete_schema
from llm_rerank.template import DEFAULT, PromptTemplate
from recsys.atomic import atomic_write_json

Engine = Literal["local", "ray"]
Method = Literal["generate", "logits"]
HOLDOUT_FRACTION = 0.5  # the share of items held out of adaptation and calibration (reports/tag_ml100k.json)


def tags_dir(artifact_dir: Path) -> Path:
    return Path(artifact_dir) / "tags"


def adapt_tagger_for(split: Any, base_dir: str, artifact_dir: Path, settings: AdaptSettings, *,
                     holdout_fraction: float = 0.5, domain: str = "movie", progress: bool = True) -> dict[str, Any]:
    """Hold out a random fraction of the catalog, LoRA-adapt on the rest, save to ``tags/model``."""
    out = tags_dir(artifact_dir)
    out.mkdir(parents=True, exist_ok=True)
    held = holdout_items(len(split.items), holdout_fraction, settings.seed)
    atomic_write_json(out / "holdout.json", {"fraction": holdout_fraction, "seed": settings.seed,
                                             "items": held.tolist()}, indent=None)
    categories = catalog_categories(split.items["categories"])
    return adapt_tagger(base_dir, split.items, categories, held, out / "model", settings, domain, progress)


def heldout_for(split: Any, out: Path, seed: int) -> np.ndarray:
    """The items held out of adaptation and calibration: ``tags/holdout.json`` when ``recsys tag adapt``
    (or an earlier logits run) wrote it, else ``quality.holdout_items`` with the same fraction and seed,
    written there so later runs and the adaptation job share it."""
    path = Path(out) / "holdout.json"
    if path.exists():
        return np.asarray(json.loads(path.read_text())["items"], dtype=np.int64)
    held = holdout_items(len(split.items), HOLDOUT_FRACTION, seed)
    atomic_write_json(path, {"fraction": HOLDOUT_FRACTION, "seed": seed, "items": held.tolist()}, indent=None)
    return held


def tag_catalog(split: Any, model_dir: str, artifact_dir: Path, settings: TaggerSettings, *,
                engine: Engine = "local", chunk_size: int = 64, batch_size: int = 16, limit: int | None = None,
                ray_address: str | None = None, ray_concurrency: int = 1, ray_cpus: int = 2,
                fresh: bool = False, progress: bool = True, prompt: PromptTemplate | None = None,
                method: Method = "generate", seed: int = 42, shots: int = 0) -> dict[str, Any]:
    """Tag ``split.items`` (first ``limit`` rows if given) with ``model_dir``; the summary dict.

    ``method="logits"`` (``jobs.tagging.logits``) scores closed fields from label logits and
    generates only free text; it calibrates on the items outside ``heldout_for`` and always
    retags every item (its thresholds need all of them), replacing the parts on disk.
    """
    template = prompt or DEFAULT
    if method not in ("generate", "logits"):
        raise ValueError(f"method must be 'generate' or 'logits', got {method!r}")
    if method == "logits" and engine != "local":
        raise ValueError(f"method 'logits' runs on the local engine only, got engine={engine!r}")
    items = split.items if limit is None else split.items.iloc[:limit].reset_index(drop=True)
    categories = catalog_categories(split.items["categories"])
    schema = concrete_schema(categories)
    out = tags_dir(artifact_dir)
    out.mkdir(parents=True, exist_ok=True)
    version = job_version(model_dir, schema, settings, chunk_size, batch_size, split.items["item_id"], template)
    if method == "logits":
        version.update({"method": "logits", "label_prompt_version": LABEL_PROMPT_VERSION, "shots": shots})
    job = TagJob(out, items, version, chunk_size, batch_size)
    pending = prepare(job, fresh=fresh or method == "logits")
    t0 = time.perf_counter()
    n_pending = sum(min(chunk_size, len(items) - c * chunk_size) for c in pending)
    extra: dict[str, Any] = {}
    if method == "logits":
        extra = _tag_logits(job, split, model_dir, schema, settings, template, out, seed, shots, progress)
    elif pending and engine == "local":
        tagger = Tagger(model_dir, schema, settings, template).load()
        run_local(job, tagger.tag_batch, pending, progress)
    elif pending and engine == "ray":
        run_ray(job, model_dir, schema, settings, pending, address=ray_address, concurrency=ray_concurrency,
                num_cpus=ray_cpus, progress=progress, template=template)
    elif engine not in ("local", "ray"):
        raise ValueError(f"engine must be 'local' or 'ray', got {engine!r}")
    seconds = time.perf_counter() - t0
    frame = finalize(job)
    summary = summarise(frame, items, categories, out, seconds, n_pending)
    summary.update({"engine": engine, "method": method, **extra, "version": job.version, "out_dir": str(out)})
    atomic_write_json(out / "summary.json", summary, default=str)
    return summary


def _tag_logits(job: TagJob, split: Any, model_dir: str, schema: dict[str, Any], settings: TaggerSettings,
                template: PromptTemplate, out: Path, seed: int, shots: int, progress: bool) -> dict[str, Any]:
    """Tag every item of ``job`` by label logits and commit its parts; thresholds and phase timings."""
    held = set(heldout_for(split, out, seed).tolist())
    cats = job.items["categories"]
    known = {i: [str(c) for c in cats.iloc[i]] for i in range(len(job.items)) if i not in held and len(cats.iloc[i])}
    tagger = LogitTagger(model_dir, schema, settings, template).load()
    rows = item_rows(job.items, job.version["categories"], 0, len(job.items))
    run = tag_items(tagger, rows, known, batch_size=job.batch_size, shots=shots, seed=seed, progress=progress)
    for chunk in range(job.n_chunks):
        write_part(job, chunk, run.results[chunk * job.chunk_size : (chunk + 1) * job.chunk_size])
    return {"thresholds": {name: t.as_dict(list(f.values)) for f, (name, t) in
                           zip(tagger.fields, run.thresholds.items(), strict=True)},
            "phase_seconds": run.seconds, "calibrated_on_items": len(known), "shots": shots}


def summarise(frame: Any, items: Any, categories: list[str], out: Path, seconds: float,
              n_tagged_now: int) -> dict[str, Any]:
    """Counts, speed and genre F1 (all items and the adaptation hold-out when one exists)."""
    predicted = [list(g) for g in frame["genres"]]
    truth = [list(c) for c in items["categories"]]
    fallbacks = int(frame["fallback"].sum())
    summary: dict[str, Any] = {
        "items": len(frame), "items_tagged_this_run": n_tagged_now, "seconds": seconds,
        "items_per_s": n_tagged_now / seconds if seconds > 0 and n_tagged_now else None,
        "new_tokens_mean": float(frame["new_tokens"].mean()),
        "schema_valid_rate": float((~frame["fallback"]).mean()), "fallbacks": fallbacks,
        "retried": int((frame["attempts"] > 1).sum()),
    }
    overall = genre_f1(predicted, truth, categories)
    summary.update({"genre_f1_micro": overall["micro"], "genre_f1_macro": overall["macro"]})
    holdout = out / "holdout.json"
    if holdout.exists():
        held = np.asarray(json.loads(holdout.read_text())["items"], dtype=np.int64)
        held = held[held < len(frame)]
        trained = np.setdiff1d(np.arange(len(frame)), held)
        for name, idx in (("heldout", held), ("adapted_on", trained)):
            f1 = genre_f1([predicted[i] for i in idx], [truth[i] for i in idx], categories)
            summary.update({f"genre_f1_micro_{name}": f1["micro"], f"genre_f1_macro_{name}": f1["macro"],
                            f"items_{name}": len(idx)})
    return summary
