"""What the LLM item embeddings add to the cascade, each use alone, on one recall fit and several coarse seeds.

Variants, each measured on the same users with the same recall fit:

- ``base``: the recall stage, then the coarse ranker;
- ``llm_channel``: the recall stage swapped for ``recall_llm`` (``recall.llm_channel``: ``llm_share`` of
  the recall depth dealt to the nearest items of the user's recent-history centroid in
  ``tags/embed``), then the *same* coarse ranker as ``base``;
- ``llm_features``: the recall stage, then a coarse ranker trained with
  ``coarse.llm_embedding_features`` (``coarse_rank.llm_features``).

The two-towers (``recall``, ``recall_holdout``) are trained once, in ``artifact_dir``, with
``settings.seed``; every coarse seed ``s`` gets ``<artifact_dir>/llm-embedding/seed-<s>/`` and
``.../seed-<s>-features/`` holding the split, links to the shared two-towers and ``tags/``, and its
own ``coarse/``, trained by ``jobs.train.train_stages`` (reused when current), so a rerun measures
without training. The tags directory must hold the embeddings (``recsys tag --method embed``).

Measured per seed and variant on ``phase``: the recall and coarse stages' NDCG@10 and Recall@10,
the target among recall's candidates, and ms per request of each stage (``recall -> coarse``
only: rules and fusion serve the coarse order by default and are left out). Each variant
against ``base``, paired per user (``offline.bootstrap.paired_bootstrap``), over all users and per
history-length slice (``jobs.evaluation.evaluate.HISTORY_SLICES``); then mean and sample sd over seeds.

Deliberately left out: tuning fusion per variant; the LLM tags (``jobs.tagging.ablation``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from cascade.registry import build_pipeline
from cascade.settings import Settings
from jobs.evaluation.cascade_run import K, run_cascade
from jobs.evaluation.evaluate import HISTORY_SLICES
from jobs.evaluation.seeds import link_shared, mean_sd
from jobs.tagging.ablation import variant_settings
from jobs.tagging.job import EMBED_METHOD
from jobs.train import train_stages
from offline.baselines import evaluate_rankings_per_user
from offline.bootstrap import MIN_USERS, paired_bootstrap
from offline.metrics import candidates_found
from offline.split import Phase, Split

VARIANTS = ("base", "llm_channel", "llm_features")
SHARED = ("recall", "recall_holdout", "tags")  # linked into every seed's directory: one fit, one embedding
METRICS = (f"ndcg@{K}", f"recall@{K}")


def seed_dir(artifact_dir: Path, seed: int, features: bool) -> Path:
    """Where coarse seed ``seed`` trains (with the LLM-embedding features or without)."""
    return Path(artifact_dir) / "llm-embedding" / f"seed-{seed}{'-features' if features else ''}"


def measure(settings: Settings, directory: Path, split: Split, phase: Phase, progress: bool) -> dict[str, Any]:
    """Per-user metrics of the recall and coarse stages, the target among recall's candidates, stage ms."""
    pipeline = build_pipeline(settings, directory, only=("recall", "coarse"), phase=phase)
    run = run_cascade(pipeline, split, phase, progress)
    per_user = {s: evaluate_rankings_per_user(split, run["tops"][s], phase, K) for s in ("recall", "coarse")}
    per_user["candidates"] = {"found": candidates_found(run["candidates"]["recall"], split.targets(phase)).astype(float)}
    ms = {s: {"mean": round(float(np.mean(v)), 3), "p50": round(float(np.median(v)), 3)}
          for s, v in run["stage_ms"].items()}
    return {"per_user": per_user, "stage_ms": ms}


def versus_base(base: dict[str, Any], other: dict[str, Any], slices: dict[str, np.ndarray], *, seed: int,
                n_boot: int) -> dict[str, Any]:
    """``other`` minus ``base``, paired per user: coarse NDCG@10 and Recall@10, and the target among
    recall's candidates, over every user and in each slice (``slices``: name -> user rows) of at least
    ``offline.bootstrap.MIN_USERS`` users (a smaller one has its count only)."""
    out: dict[str, Any] = {}
    for name, rows in slices.items():
        cell: dict[str, Any] = {"users": int(len(rows))}
        if len(rows) < MIN_USERS:  # no interval exists
            out[name] = cell
            continue
        for stage, metric in (("coarse", METRICS[0]), ("coarse", METRICS[1]), ("candidates", "found")):
            a, b = base["per_user"][stage][metric][rows], other["per_user"][stage][metric][rows]
            r = paired_bootstrap(a, b, n_boot=n_boot, seed=seed)
            cell[f"{stage}_{metric}"] = {"mean": round(r["mean"], 5), "ci95": [round(x, 5) for x in r["ci95"]]}
        out[name] = cell
    return out


def history_slices(split: Split, phase: Phase) -> dict[str, np.ndarray]:
    """Rows of the users with a target: all of them, and those of each history-length slice."""
    length = np.array([len(split.history(u, phase)) for u in range(split.n_users)])
    has = split.targets(phase) >= 0
    out = {"all": np.flatnonzero(has)}
    out.update({f"history_{name}": np.flatnonzero(has & (length >= lo) & (length <= hi))
                for name, (lo, hi) in HISTORY_SLICES.items()})
    return out


def train_variants(settings: Settings, artifact_dir: Path, split: Split, seed: int, progress: bool
                   ) -> dict[str, Any]:
    """Train (or reuse) seed ``seed``'s two coarse rankers; their training seconds."""
    out: dict[str, Any] = {}
    for features in (False, True):
        directory = seed_dir(artifact_dir, seed, features)
        link_shared(artifact_dir, directory, SHARED)
        trained = train_stages(variant(settings, seed, "llm_features" if features else "base"), directory, split,
                               stages=("coarse",), progress=progress)["coarse"]
        out["features" if features else "base"] = {"reused": bool(trained.get("reused")),
                                                   "seconds": trained.get("seconds"),
                                                   "valid_ndcg@10": trained.get("valid_ndcg@10")}
    return out


def variant(settings: Settings, seed: int, name: str, llm_share: float = 0.2) -> Settings:
    """``settings`` for one variant and coarse seed (``VARIANTS``). The coarse LLM columns are on in
    ``llm_features`` only: under ``auto`` the linked ``tags/`` would switch them on wherever they lift."""
    alone = settings.coarse.model_copy(update={"llm_embedding_features": False})
    seeded = settings.model_copy(update={"seed": seed, "coarse": alone})
    if name == "llm_channel":
        return variant_settings(seeded, "llm_channel", llm_share)
    if name == "llm_features":
        coarse = seeded.coarse.model_copy(update={"llm_embedding_features": True})
        return seeded.model_copy(update={"coarse": coarse})
    return seeded


def embedding_report(settings: Settings, artifact_dir: Path, split: Split, *, seeds: tuple[int, ...],
                     llm_share: float = 0.2, phase: Phase = "test", n_boot: int = 1000, progress: bool = True
                     ) -> dict[str, Any]:
    """Every variant per coarse seed (module docstring), each against ``base``, and mean +- sd over seeds."""
    artifact_dir = Path(artifact_dir)
    t0 = time.perf_counter()
    recall = train_stages(settings, artifact_dir, split, stages=("recall", "recall_holdout"), progress=progress)
    slices = history_slices(split, phase)
    per_seed: dict[int, dict[str, Any]] = {}
    for seed in seeds:
        row: dict[str, Any] = {"coarse_training": train_variants(settings, artifact_dir, split, seed, progress)}
        measured = {name: measure(variant(settings, seed, name, llm_share),
                                  seed_dir(artifact_dir, seed, name == "llm_features"), split, phase, progress)
                    for name in VARIANTS}
        all_rows = slices["all"]
        row["variants"] = {name: {**{f"{stage}_{metric}": round(float(m["per_user"][stage][metric][all_rows].mean()), 5)
                                     for stage in ("recall", "coarse") for metric in METRICS},
                                  "candidates_found": round(float(m["per_user"]["candidates"]["found"][all_rows].mean()), 5),
                                  "stage_ms": m["stage_ms"]}
                           for name, m in measured.items()}
        row["vs_base"] = {name: versus_base(measured["base"], measured[name], slices, seed=seed, n_boot=n_boot)
                          for name in VARIANTS if name != "base"}
        per_seed[seed] = row
    return {"dataset": split.name, "phase": phase, "seeds": list(seeds), "llm_share": llm_share,
            "recall_fit": {stage: {"reused": bool(r.get("reused")), "seed": settings.seed} for stage, r in recall.items()},
            "embedding": embedding_cost(artifact_dir), "slices": {name: int(len(rows)) for name, rows in slices.items()},
            "summary": (summary := summarise(per_seed)), "table": table(summary, per_seed), "per_seed": per_seed,
            "seconds": round(time.perf_counter() - t0, 1)}


def embedding_cost(artifact_dir: Path) -> dict[str, Any]:
    """The offline cost of the embeddings, from the summary ``recsys tag --method embed`` wrote (empty
    when another run made them)."""
    path = Path(artifact_dir) / "tags" / "summary.json"
    summary = json.loads(path.read_text()) if path.is_file() else {}
    if summary.get("method") != EMBED_METHOD:
        return {}
    keep = ("items", "items_encoded_this_run", "seconds", "items_per_s")
    return {**{k: summary.get(k) for k in keep}, "projection": summary.get("projection"),
            "model_digest": summary["version"]["model_digest"], "item_text": summary["version"]["item_text"]}


def merge_reports(report: dict[str, Any], earlier: list[dict[str, Any]]) -> dict[str, Any]:
    """``report`` with the seeds of ``earlier`` reports (other runs of ``embedding_report`` on the same
    split and recall fit) joined in, the summary and table recomputed over all of them; a ValueError
    when one was made on another dataset, phase or channel share, or repeats a seed."""
    per_seed = {int(k): v for k, v in report["per_seed"].items()}
    for other in earlier:
        for key in ("dataset", "phase", "llm_share", "slices"):
            if other.get(key) != report[key]:
                raise ValueError(f"an included report has {key} {other.get(key)!r}, this run {report[key]!r}")
        for seed, row in other["per_seed"].items():
            if int(seed) in per_seed:
                raise ValueError(f"seed {seed} is in more than one report")
            per_seed[int(seed)] = row
    per_seed = dict(sorted(per_seed.items()))
    summary = summarise(per_seed)
    return {**report, "seeds": list(per_seed), "summary": summary, "table": table(summary, per_seed),
            "per_seed": per_seed, "seconds": round(report["seconds"] + sum(o.get("seconds", 0) for o in earlier), 1)}


def summarise(per_seed: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Mean and sample sd over seeds of every variant's metrics and of every paired delta's mean.

    >>> s = summarise({1: {"variants": {"base": {"coarse_ndcg@10": 0.1}}, "vs_base": {}},
    ...                2: {"variants": {"base": {"coarse_ndcg@10": 0.3}}, "vs_base": {}}})
    >>> s["variants"]["base"]["coarse_ndcg@10"]
    {'mean': 0.2, 'sd': 0.14142, 'per_seed': [0.1, 0.3]}
    """
    def stat(values: list[float]) -> dict[str, Any]:
        return {**mean_sd(values), "per_seed": values}

    rows = list(per_seed.values())
    variants = {name: {key: stat([r["variants"][name][key] for r in rows])
                       for key, value in metrics.items() if isinstance(value, float)}
                for name, metrics in rows[0]["variants"].items()}
    deltas: dict[str, Any] = {}
    for name, sliced in rows[0]["vs_base"].items():
        deltas[name] = {}
        for slice_name, cell in sliced.items():
            deltas[name][slice_name] = {"users": cell["users"]} if len(cell) == 1 else {key: {**stat([r["vs_base"][name][slice_name][key]["mean"] for r in rows]),
                                              "ci95_per_seed": [r["vs_base"][name][slice_name][key]["ci95"]
                                                                for r in rows]}
                                        for key in cell if key != "users"}
    return {"variants": variants, "vs_base": deltas}


def table(summary: dict[str, Any], per_seed: dict[int, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """One flat row per variant for the docs' tables: coarse NDCG@10 and Recall@10 (mean, sd over seeds),
    the target among recall's candidates, the paired NDCG@10 delta with ``base`` (mean and sd over
    seeds, each seed's CI, the history 1-5 slice's mean) and the stages' mean ms per request."""
    out: dict[str, dict[str, Any]] = {}
    for name, m in summary["variants"].items():
        row: dict[str, Any] = {key: m[key]["mean"] for key in ("coarse_ndcg@10", "coarse_recall@10", "candidates_found")}
        row.update({f"{key}_sd": m[key]["sd"] for key in ("coarse_ndcg@10", "coarse_recall@10")})
        delta = summary["vs_base"].get(name)
        if delta is not None:
            row.update({"delta_ndcg@10": delta["all"]["coarse_ndcg@10"]["mean"],
                        "delta_ndcg@10_sd": delta["all"]["coarse_ndcg@10"]["sd"],
                        "delta_recall@10": delta["all"]["coarse_recall@10"]["mean"],
                        "delta_candidates_found": delta["all"]["candidates_found"]["mean"]})
            row.update({f"ci95_seed_{seed}": ci for seed, ci in
                        zip(per_seed, delta["all"]["coarse_ndcg@10"]["ci95_per_seed"], strict=True)})
            short = delta.get("history_1-5", {}).get("coarse_ndcg@10")
            row["delta_ndcg@10_history_1-5"] = short["mean"] if short else None
        for stage in ("recall", "coarse"):
            row[f"{stage}_ms"] = round(float(np.mean([r["variants"][name]["stage_ms"][stage]["mean"]
                                                      for r in per_seed.values()])), 2)
        out[name] = row
    return out
