"""One-run comparison of tagging by label logits (per backbone) with the generation path.

``compare_taggers`` tags the *whole* catalog of a dataset directory (ML-100K: all 1,682 items
of ``u.item``, not only the 1,349 of the 5-core split) with ``jobs.tagging.logits`` for each
backbone, then runs the generation path (``jobs.tagging.generate``) on a seeded random
subsample of the held-out items, in the same process, so items/s are comparable.

Held-out items are exactly those of ``results/tagging/generate_adapted_ml100k.json``: ``quality.holdout_items`` over
the split's items with fraction 0.5 and the config seed, matched to the catalog by item id.
Thresholds are calibrated on every other catalog item with known categories; held-out labels
are read only to score. Each row reports items/s (tagging time after the model is loaded; the
load is reported apart), genre F1 (micro, macro) on the held-out items and on the generation
subsample, and the schema-valid share, every document validated again here. A constant
prediction (the two most frequent calibration genres for every item) is reported as the floor.

Deliberately left out: writing tag files (``jobs.tagging.run``).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from jobs.tagging.generate import Tagger, TaggerSettings
from jobs.tagging.job import item_rows
from jobs.tagging.logits import LogitTagger, tag_items
from jobs.tagging.quality import genre_f1, holdout_items
from jobs.tagging.run import HOLDOUT_FRACTION
from jobs.tagging.schema import catalog_categories, concrete_schema, validation_errors
from llm_rerank.template import DEFAULT


def _valid(results: list[dict[str, Any]], schema: dict[str, Any]) -> float:
    ok = [not r["fallback"] and not validation_errors(json.loads(r["raw"]), schema) if r["raw"].strip()
          else False for r in results]
    return float(np.mean(ok)) if ok else 0.0


def _f1(results: list[dict[str, Any]], truth: list[list[str]], positions: np.ndarray,
        categories: list[str]) -> dict[str, float]:
    return genre_f1([list(results[i]["genres"]) for i in positions], [truth[i] for i in positions], categories)


def compare_taggers(split_items: pd.DataFrame, catalog: pd.DataFrame, backbones: dict[str, str],
                    generation_model: str | None, *, generation_sample: int = 40, seed: int = 42,
                    settings: TaggerSettings | None = None, batch_size: int = 64, shots: int = 0,
                    generation_batch_size: int = 16,
                    generation_max_new_tokens: int = 128,
                    checkpoint: Callable[[dict[str, Any]], None] = lambda report: None,
                    progress: bool = True) -> dict[str, Any]:
    """The comparison report (a dict) for ``backbones`` (name -> model directory); ``checkpoint`` gets the
    report so far after every row (a long run leaves its finished rows behind)."""
    settings = settings or TaggerSettings(precision="fp32")
    categories = catalog_categories(split_items["categories"])
    schema = concrete_schema(categories)
    held_ids = set(split_items["item_id"].astype(str).iloc[holdout_items(len(split_items), HOLDOUT_FRACTION, seed)])
    ids = catalog["item_id"].astype(str).tolist()
    missing = held_ids - set(ids)
    if missing:
        raise ValueError(f"{len(missing)} held-out items are not in the catalog (e.g. {sorted(missing)[:3]})")
    truth = [[str(c) for c in cats] for cats in catalog["categories"]]
    held = np.array([i for i, x in enumerate(ids) if x in held_ids], dtype=np.int64)
    known = {i: truth[i] for i in range(len(ids)) if ids[i] not in held_ids and truth[i]}
    sample = np.sort(np.random.default_rng(seed).choice(held, size=min(generation_sample, len(held)), replace=False))
    rows = item_rows(catalog, categories, 0, len(catalog))
    top2 = [g for g, _ in Counter(g for i in known for g in known[i] if g in categories).most_common(2)]
    report: dict[str, Any] = {
        "catalog_items": len(catalog), "heldout_items": len(held), "calibration_items": len(known),
        "heldout_rule": f"quality.holdout_items(n={len(split_items)} split items, fraction={HOLDOUT_FRACTION}, "
                        f"seed={seed}), matched by item id",
        "generation_sample": {"items": len(sample), "seed": seed, "rule": "numpy default_rng(seed).choice of the "
                              "held-out items without replacement"},
        "settings": {"shots": shots, "precision": settings.precision, "threads": settings.threads, "batch_size": batch_size,
                     "generation_batch_size": generation_batch_size,
                     "free_text_max_new_tokens": settings.max_new_tokens, "title_chars": settings.title_chars},
        "floor_constant_top2": {"genres": top2, **{f"f1_{k}": v for k, v in genre_f1(
            [top2] * len(held), [truth[i] for i in held], categories).items() if k != "items"}},
        "rows": [],
    }
    for k, (name, model_dir) in enumerate(backbones.items()):
        if k == 1 and generation_model is not None:  # generation right after the first backbone (cheapest first)
            _add_generation_row(report, generation_model, schema, settings, generation_max_new_tokens,
                                [rows[i] for i in sample], [truth[i] for i in sample], categories, generation_batch_size,
                                checkpoint)
        tagger = LogitTagger(model_dir, schema, settings, DEFAULT)
        report["rows"].append(_logits_row(name, tagger, rows, known, truth, (held, sample), categories,
                                          batch_size=batch_size, shots=shots, seed=seed, progress=progress))
        del tagger
        checkpoint(report)
    if generation_model is not None and len(backbones) < 2:
        _add_generation_row(report, generation_model, schema, settings, generation_max_new_tokens,
                            [rows[i] for i in sample], [truth[i] for i in sample], categories, generation_batch_size,
                            checkpoint)
    return report



def _logits_row(name: str, tagger: LogitTagger, rows: list[dict[str, Any]], known: dict[int, list[str]],
                truth: list[list[str]], measured: tuple[np.ndarray, np.ndarray], categories: list[str], *,
                batch_size: int, shots: int, seed: int, progress: bool) -> dict[str, Any]:
    """One backbone's logit tagger over the whole catalog: speed, and F1 on the held-out items and on
    the generation path's subsample (``measured``)."""
    t0 = time.perf_counter()
    tagger.load()
    load_s = time.perf_counter() - t0
    run = tag_items(tagger, rows, known, batch_size=batch_size, shots=shots, seed=seed, progress=progress)
    held, sample = measured
    held_f1, sample_f1 = _f1(run.results, truth, held, categories), _f1(run.results, truth, sample, categories)
    return {
        "method": "logits", "backbone": name, "items": len(rows), "seconds": run.seconds["total"],
        "items_per_s": len(rows) / run.seconds["total"], "load_s": load_s, "phase_seconds": run.seconds,
        "heldout_f1_micro": held_f1["micro"], "heldout_f1_macro": held_f1["macro"],
        "sample_f1_micro": sample_f1["micro"], "sample_f1_macro": sample_f1["macro"],
        "schema_valid": _valid(run.results, tagger.schema),
        "free_text_cut_by_budget": sum(bool(r["reason"]) for r in run.results),
        "thresholds": run.thresholds["genres"].as_dict(categories),
        "example": json.loads(run.results[0]["raw"]),
    }


def _add_generation_row(report: dict[str, Any], model_dir: str, schema: dict[str, Any], settings: TaggerSettings,
                        max_new_tokens: int, rows: list[dict[str, Any]], truth: list[list[str]],
                        categories: list[str], batch_size: int, checkpoint: Callable[[dict[str, Any]], None]) -> None:
    # the generation path writes the whole document (114 new tokens on average): its own default budget
    gen_settings = replace(settings, max_new_tokens=max_new_tokens)
    report["rows"].append(_generation_row(model_dir, schema, gen_settings, rows, truth, categories, batch_size))
    checkpoint(report)


def _generation_row(model_dir: str, schema: dict[str, Any], settings: TaggerSettings, rows: list[dict[str, Any]],
                    truth: list[list[str]], categories: list[str], batch_size: int) -> dict[str, Any]:
    """The generation path on the subsample (base model: no adapted tagger is assumed to exist)."""
    t0 = time.perf_counter()
    tagger = Tagger(model_dir, schema, settings, DEFAULT).load()
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    results = []
    for start in range(0, len(rows), batch_size):
        results += tagger.tag_batch(rows[start : start + batch_size])
    seconds = time.perf_counter() - t0
    f1 = genre_f1([list(r["genres"]) for r in results], truth, categories)
    return {"method": "generate", "backbone": model_dir, "items": len(rows), "seconds": seconds,
            "items_per_s": len(rows) / seconds, "load_s": load_s, "max_new_tokens": settings.max_new_tokens,
            "sample_f1_micro": f1["micro"],
            "sample_f1_macro": f1["macro"], "schema_valid": _valid(results, schema),
            "retried": sum(r["attempts"] > 1 for r in results),
            "new_tokens_mean": float(np.mean([r["new_tokens"] for r in results]))}
