"""Which item-side knowledge reaches new items: the cold-item slice with each source on alone.

``jobs.evaluation.cold_items`` trains a cascade without the interactions of the items first seen after a
cutoff and measures the users whose test item is one of them. A new item can only be recalled
and ranked through what the cascade knows of it without interactions. This job measures that
slice once per source:

- ``none``: nothing (the two-tower without text: a new item is an untrained id);
- ``text``: MiniLM text in the two-tower's item tower (``recall.use_text``, the default);
- ``llm_tags``: LLM tags as coarse features (``coarse_tags/``, ``jobs.coarse_tags``), two-tower
  without text;
- ``llm_embedding``: the LLM-embedding recall channel (``recall_llm``, ``recall.llm_channel``), two-tower
  without text;
- ``text+llm_tags``, ``text+llm_embedding``: each LLM source on top of the default.
- ``text+llm_rerank``: the default plus the LLM re-ranker over coarse's top ``llm.candidates``
  (``rerank_variant``). The LLM is the cold cascade's own adaptation (``<cold>/llm``, from
  ``recsys eval --config configs/pipeline_llm.yaml``) when present, else the base backbone
  zero-shot; the report says which. One LLM call per request costs seconds on CPU, so this
  variant measures every cold-item user and a seeded sample of ``rerank_users`` warm-item users,
  and its fusion gate is fitted (``jobs.fusion_gate.fit_gate``, not saved) on a seeded sample of
  ``rerank_users`` valid users unless weights tuned on all of them exist. Its own
  ``llm_vs_coarse`` per slice answers whether the re-ranker lifts new items; ``final_vs_coarse``
  is what the gate serves, and ``llm_routing`` reads it.

The LLM sources are rebuilt on the cold split so nothing about the new items' interactions or
labels is learnt: the catalog is tagged by label logits (``jobs.tagging.run``, method
``logits``) with thresholds calibrated on the items outside the usual tag holdout *and* outside
the new items, and the embedding projection (``jobs.tagging.embed``) trains on the cold split's
training sequences, which hold no new item. The text and no-text cascades share the cold split,
the tags and the embeddings; each has its own two-tower, coarse and fusion
(``<artifact_dir>/cold-items/`` and ``<artifact_dir>/cold-items-no-text/cold-items/``).
A variant with an LLM source has its own fusion weights key, so fusion is tuned for it on valid
(``jobs.train``) and its gate decides what ``final`` serves.

Deliberately left out: tagger adaptation (the base model tags; ``recsys tag adapt`` is not run on
the cold split).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from cascade.registry import weights_key
from cascade.settings import Settings
from fusion.stage import WEIGHTS_FILE
from jobs.evaluation.cascade_run import requests_for
from jobs.evaluation.cold_items import item_slices, measure_cold, prepare_cold, train_cold
from jobs.fusion_gate import fit_gate, gate_pipeline
from jobs.tagging.ablation import variant_settings
from jobs.tagging.embed import EmbedSettings
from jobs.tagging.quality import holdout_items
from jobs.tagging.run import HOLDOUT_FRACTION
from jobs.train import split_id, train_stages
from llm_rerank.backbone import resolve_model, weights_digest
from offline.bootstrap import paired_bootstrap
from offline.split import Split, prepared_item_noun
from recsys.atomic import atomic_write_json
from recsys.config import StageSpec

# variant -> (two-tower with text, ablation swaps of jobs.tagging.ablation)
VARIANTS: dict[str, tuple[bool, tuple[str, ...]]] = {
    "none": (False, ()), "text": (True, ()), "llm_tags": (False, ("tag_features",)),
    "llm_embedding": (False, ("llm_channel",)), "text+llm_tags": (True, ("tag_features",)),
    "text+llm_embedding": (True, ("llm_channel",)), "text+llm_rerank": (True, ("llm_rerank",)),
}
RERANK_BUDGET_MS = 10_000.0  # the LLM stage's budget while measured (configs/pipeline_llm.yaml): no fallback hides
RERANK_REQUEST_MS = 15_000.0  # its order on a slow machine; stage_status still counts any fallback
NO_TEXT_DIR = "cold-items-no-text"
SOURCES_FILE = "cold_sources.json"


def variant_pipeline(settings: Settings, variant: str, llm_share: float = 0.2) -> Settings:
    """``settings`` for ``variant``: text on/off in the two-tower, and the LLM source's stage swap."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown cold-source variant {variant!r}; choose from {sorted(VARIANTS)}")
    text, swaps = VARIANTS[variant]
    # the coarse LLM columns stay off: under auto the cold split's tags/ would switch them on in every variant
    coarse = settings.coarse.model_copy(update={"llm_embedding_features": False})
    out = settings.model_copy(update={"recall": settings.recall.model_copy(update={"use_text": text}),
                                      "coarse": coarse})
    if "tag_features" in swaps:
        out = variant_settings(out, "tag_features")
    if "llm_channel" in swaps:
        out = variant_settings(out, "llm_channel", llm_share)
    if "llm_rerank" in swaps:
        out = with_llm_stage(out)
    return out


def with_llm_stage(settings: Settings) -> Settings:
    """``settings`` with the LLM stage on after coarse (added with ``llm.candidates`` depth when the
    pipeline has none), and budgets at least ``RERANK_BUDGET_MS`` / ``RERANK_REQUEST_MS``.

    >>> s = with_llm_stage(Settings())
    >>> [(x.name, x.enabled, x.budget_ms) for x in s.pipeline.stages if x.kind == "llm"]
    [('llm', True, 10000.0)]
    """
    stages, found = [], False
    for spec in settings.pipeline.stages:
        if spec.kind == "llm":
            found = True
            spec = spec.model_copy(update={"enabled": True, "budget_ms": max(spec.budget_ms or 0.0, RERANK_BUDGET_MS)})
        stages.append(spec)
    if not found:
        at = next((i + 1 for i, s in enumerate(stages) if s.kind == "coarse"), None)
        if at is None:
            raise ValueError("the text+llm_rerank variant needs a coarse stage to re-rank after")
        stages.insert(at, StageSpec(name="llm", kind="llm", depth=settings.llm.candidates, budget_ms=RERANK_BUDGET_MS))
    pipe = settings.pipeline.model_copy(update={
        "stages": stages, "request_budget_ms": max(settings.pipeline.request_budget_ms, RERANK_REQUEST_MS)})
    return settings.model_copy(update={"pipeline": pipe})


def rerank_variant(settings: Settings, root: Path, cold: Split, *, users: int, phase: str = "test",
                   n_boot: int = 1000, progress: bool = True,
                   per_user: dict[str, dict[str, np.ndarray]] | None = None) -> dict[str, Any]:
    """The ``text+llm_rerank`` row (module docstring): which LLM, the gate and its evidence, and the
    cold-item slice (every user) and a warm-item sample measured through the LLM path."""
    rng = np.random.default_rng(settings.seed)
    adapted = (root / "llm" / "train_meta.json").exists() and settings.llm.use_adapted
    tuned = (root / "fusion" / weights_key(settings) / WEIGHTS_FILE).exists()
    gate: dict[str, Any] = {"source": "weights.json (tuned on the valid users)"} if tuned else {}
    if not tuned:
        trainable = cold.valid_trainable()
        pool = [r for r in requests_for(cold, "valid") if trainable[r.user_idx]]
        picked = sorted(rng.choice(len(pool), size=min(users, len(pool)), replace=False).tolist())
        fitted = fit_gate(gate_pipeline(settings, root), cold, [pool[i] for i in picked], settings, progress=progress)
        gate = {"source": f"fit_gate on {len(picked)} sampled valid users (not saved)",
                "weights": fitted["weights"], "valid_ndcg@10": round(fitted["valid_ndcg@10"], 5),
                "single_stage_valid_ndcg@10": {s: round(v, 5) for s, v in fitted["single_stage_valid_ndcg"].items()},
                "mixture_check": fitted["mixture_check"]}
        settings = settings.model_copy(update={"fusion": settings.fusion.model_copy(
            update={"weights": fitted["weights"]})})
    slices = item_slices(cold, cold.targets(phase))  # type: ignore[arg-type]
    warm = slices["warm_item"]
    sample = np.sort(rng.choice(warm, size=min(users, len(warm)), replace=False))
    measured = np.union1d(slices["cold_item"], sample)
    row = measure_cold(settings, root, cold, phase=phase, n_boot=n_boot, progress=progress, per_user=per_user,
                       users=measured)
    return {"llm": {"model": settings.llm.model, "adapted_on_cold_split": bool(adapted),
                    "zero_shot": not adapted, "candidates": settings.llm.candidates},
            "gate": gate, "warm_item_sample": {"users": int(len(sample)), "of": int(len(warm)), "seed": settings.seed},
            **row}


def cold_tag_holdout(n_items: int, new: np.ndarray, seed: int) -> np.ndarray:
    """Items whose labels calibrate nothing: the usual tag holdout plus the new items.

    >>> cold_tag_holdout(10, np.array([9]), 0).tolist() == sorted(set(holdout_items(10, 0.5, 0).tolist()) | {9})
    True
    """
    return np.union1d(holdout_items(n_items, HOLDOUT_FRACTION, seed), np.asarray(new, dtype=np.int64))


def sources_inputs(cold_dir: Path, holdout: dict[str, Any], model: str, embed: EmbedSettings) -> dict[str, Any]:
    """What the cold split's tags and embeddings are made from; they are reused only while it is unchanged."""
    return {"split": split_id(cold_dir), "holdout": holdout, "model": model, "model_weights": weights_digest(model),
            "embed": asdict(embed)}


def prepare_llm_sources(settings: Settings, cold_dir: Path, cold: Split, *, progress: bool = True) -> dict[str, Any]:
    """Tag the cold split's catalog by logits and train the embedding projection, unless both were made
    from the same inputs (``sources_inputs``, recorded in ``tags/cold_sources.json`` once both are done);
    their reports."""
    from jobs.tagging.embed import train_embeddings  # lazy: imports torch
    from jobs.tagging.generate import TaggerSettings  # lazy: imports torch and xgrammar
    from jobs.tagging.run import TagOptions, tag_catalog  # lazy: imports torch and xgrammar

    tags = cold_dir / "tags"
    tags.mkdir(parents=True, exist_ok=True)
    held = cold_tag_holdout(cold.n_items, cold.unseen_items, settings.seed)
    holdout = {"fraction": HOLDOUT_FRACTION, "seed": settings.seed, "items": held.tolist(),
               "plus_new_items": len(cold.unseen_items)}
    model = resolve_model(settings.llm, Path(settings.artifacts_dir))
    embed = EmbedSettings(seed=settings.seed)
    inputs = sources_inputs(cold_dir, holdout, model, embed)
    marker = tags / SOURCES_FILE
    if marker.exists() and json.loads(marker.read_text()) == inputs and (tags / "embed" / "meta.json").exists():
        return {"tagging": {"reused": True}, "embedding": {"reused": True}}
    marker.unlink(missing_ok=True)  # written last: a run that stops half-way is redone, never reused
    (tags / "holdout.json").write_text(json.dumps(holdout))  # tag_catalog calibrates outside these items
    noun = prepared_item_noun(cold_dir, settings.llm.domain)
    summary = tag_catalog(cold, model, cold_dir, TaggerSettings(domain=noun, precision="fp32"),
                          TagOptions(method="logits", batch_size=64, seed=settings.seed, progress=progress))
    shutil.rmtree(tags / "embed", ignore_errors=True)  # projections of older states are stale
    meta = train_embeddings(cold, tags, embed)
    atomic_write_json(marker, inputs)
    out: dict[str, Any] = {
        "tagging": {k: summary.get(k) for k in ("items", "seconds", "items_per_s", "genre_f1_micro_heldout",
                                                "items_heldout", "schema_valid_rate", "calibrated_on_items")},
        "embedding": {**{k: meta[k] for k in ("pairs", "seconds", "n_items")},
                      "loss_first_last": [meta["loss_per_epoch"][0], meta["loss_per_epoch"][-1]]}}
    return out


def cold_source_report(settings: Settings, artifact_dir: Path, split: Split, *, share: float = 0.1,
                       phase: str = "test", variants: tuple[str, ...] = tuple(VARIANTS), llm_share: float = 0.2,
                       n_boot: int = 1000, progress: bool = True, rerank_users: int = 150) -> dict[str, Any]:
    """The cold- and warm-item slices per variant (module docstring), with what each variant trained."""
    from jobs.coarse_tags import ensure_coarse_tags  # lazy: imports scipy (coarse_rank)

    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown cold-source variant(s) {unknown}; choose from {sorted(VARIANTS)}")
    for variant in variants:  # a variant this pipeline cannot run is refused before anything trains
        variant_pipeline(settings, variant, llm_share)
    t0 = time.perf_counter()
    artifact_dir = Path(artifact_dir)
    cold_dir, cold = prepare_cold(artifact_dir, split, share)
    needs_llm = any(set(VARIANTS[v][1]) - {"llm_rerank"} for v in variants)  # tags or embeddings to build
    report: dict[str, Any] = {"share": share, "phase": phase, "new_items": int(len(cold.unseen_items)),
                              "of_items": cold.n_items, "llm_share": llm_share, "variants": {}}
    if needs_llm:
        report["llm_sources"] = prepare_llm_sources(settings, cold_dir, cold, progress=progress)
    roots = {True: cold_dir}
    if any(not VARIANTS[v][0] for v in variants):
        parent = artifact_dir / NO_TEXT_DIR
        if not (parent / "split").exists() or split_id(parent) != split_id(artifact_dir):  # a re-prepared split
            shutil.rmtree(parent / "split", ignore_errors=True)
            shutil.copytree(artifact_dir / "split", parent / "split")
        roots[False], _ = prepare_cold(parent, split, share)
        if needs_llm:  # same cold split, so the same tags and embeddings
            shutil.rmtree(roots[False] / "tags", ignore_errors=True)
            shutil.copytree(cold_dir / "tags", roots[False] / "tags")
    trained: dict[bool, dict[str, Any]] = {}
    per_user: dict[str, dict[str, dict[str, np.ndarray]]] = {}
    for variant in variants:
        text, swaps = VARIANTS[variant]
        root, base = roots[text], variant_pipeline(settings, "text" if text else "none")
        if text not in trained:
            trained[text] = {k: v.get("seconds") for k, v in train_cold(base, root, cold, progress).items()}
        row: dict[str, Any] = {"two_tower_text": text, "train_s": trained[text]}
        rebuilt = bool(report.get("llm_sources")) and "reused" not in report["llm_sources"]["embedding"]
        if "tag_features" in swaps:
            tagged = ensure_coarse_tags(base, root, cold, progress=progress)
            rebuilt = rebuilt or tagged["trained"]
            row["coarse_tags"] = {"trained_now": tagged["trained"],
                                  **{k: v for k, v in tagged["report"].items() if k.startswith("valid_ndcg")}}
        chosen = variant_pipeline(settings, variant, llm_share)
        per_user[variant] = {}
        if "llm_rerank" in swaps:  # its gate is fitted on a sample, not tuned on every valid user
            row.update(rerank_variant(chosen, root, cold, users=rerank_users, phase=phase, n_boot=n_boot,
                                      progress=progress, per_user=per_user[variant]))
        else:
            if swaps:  # its own fusion weights key (the swapped stage's kind or params): tuned on valid (jobs.train)
                fused = train_stages(chosen, root, cold, stages=("fusion",), force=rebuilt, progress=progress)["fusion"]
                row["fusion"] = {"trained_now": not fused.get("reused"), "seconds": fused.get("seconds")}
            row.update(measure_cold(chosen, root, cold, phase=phase, n_boot=n_boot, progress=progress,
                                    per_user=per_user[variant]))
        report["variants"][variant] = row
    report["vs_base"] = variant_deltas(per_user, seed=settings.seed, n_boot=n_boot)
    report["seconds"] = round(time.perf_counter() - t0, 1)
    return report


def variant_deltas(per_user: dict[str, dict[str, dict[str, np.ndarray]]], *, seed: int = 0, n_boot: int = 1000
                   ) -> dict[str, Any]:
    """Each variant against the one without its LLM source (``none`` or ``text``, when measured), per
    slice and stage: the mean difference on the same users of NDCG@10 (``<stage>``) and of the
    target being among the stage's candidates (``candidates:<stage>``), with paired-bootstrap 95% CIs.

    >>> d = variant_deltas({"none": {"cold_item": {"recall": np.zeros(4)}},
    ...                     "llm_embedding": {"cold_item": {"recall": np.full(4, 0.5)}}}, n_boot=10)
    >>> d["llm_embedding_vs_none"]["cold_item"]["recall"]
    {'mean': 0.5, 'ci95': [0.5, 0.5]}
    """
    out: dict[str, Any] = {}
    for variant, slices in per_user.items():
        text, swaps = VARIANTS[variant]
        base = "text" if text else "none"
        if not swaps or base not in per_user:
            continue
        rows: dict[str, Any] = {}
        for name, stages in slices.items():
            rows[name] = {}
            for stage, values in stages.items():
                ref = per_user[base][name].get(stage)
                if ref is None or len(ref) != len(values) or not len(values):
                    continue
                r = paired_bootstrap(ref, values, n_boot=n_boot, seed=seed)
                rows[name][stage] = {"mean": round(r["mean"], 5), "ci95": [round(x, 5) for x in r["ci95"]]}
        out[f"{variant}_vs_{base}"] = rows
    return out
