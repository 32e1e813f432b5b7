"""``recsys eval --seeds N``: train and evaluate the cascade N times, report mean, sd, per seed.

One split (prepared once in ``artifact_dir/split``) is copied into ``artifact_dir/seed-<s>/``
for the seeds ``s = settings.seed, settings.seed + 1, ...``; each seed trains every stage
there with ``Settings.seed = s`` (two-tower init and batches, LightGBM bagging, bootstrap)
and runs ``jobs.evaluation.evaluate.evaluate_pipeline`` on the same phase. The full per-seed report
goes to ``seed-<s>/eval_<phase>.json``; the returned report holds, for every numeric figure
of the sections in ``SUMMARISED`` (stage metrics, deltas, candidate recall, per-channel
candidate recall, rule and fusion costs, training seconds), its mean, sample sd and the
per-seed values, and for each delta whether its mean exceeds the seeds' sd (``beyond_sd``):
one seed's lift of the size of the run-to-run spread is not a lift. Each ``per_seed`` entry
keeps its ``lists`` and training ``warnings``, which ``recsys eval`` checks as for one run, and
its ``llm_sources`` (a gated LLM source may be switched on for one seed and not another).

Deliberately left out: parallel seeds (the stages already use the cores) and re-splitting
the data per seed (the spread measured is the training's, not the split's).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from cascade.settings import MAX_SEED, Settings
from jobs.evaluation.baselines import baseline_warnings
from jobs.evaluation.evaluate import evaluate_pipeline
from jobs.evaluation.fit_report import fit_summary, served_choices, training_warnings
from jobs.train import train_stages
from offline.split import Split
from recsys.atomic import atomic_write_json

SUMMARISED = ("stages", "deltas", "baselines", "candidate_recall", "channel_recall", "policy_costs", "train_s")


def seed_dirs(artifact_dir: Path, first: int, n: int) -> list[tuple[int, Path]]:
    """``[(seed, artifact_dir/seed-<seed>)]`` for ``n`` consecutive seeds from ``first``."""
    if n < 1:
        raise ValueError(f"--seeds must be >= 1, got {n}")
    if first + n - 1 > MAX_SEED:
        raise ValueError(f"--seeds {n} from seed {first} reaches seed {first + n - 1}, past the largest seed {MAX_SEED}")
    return [(s, Path(artifact_dir) / f"seed-{s}") for s in range(first, first + n)]


def share_split(artifact_dir: Path, seed_dir: Path) -> None:
    """Copy ``artifact_dir/split`` into ``seed_dir/split`` unless an identical one is there."""
    src, dst = Path(artifact_dir) / "split", Path(seed_dir) / "split"
    same = dst.is_dir() and all((dst / f.name).is_file() and (dst / f.name).read_bytes() == f.read_bytes()
                                for f in src.iterdir() if f.is_file())
    if not same:
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst)


def link_shared(artifact_dir: Path, directory: Path, names: tuple[str, ...]) -> None:
    """``directory`` with ``artifact_dir``'s split copied (``share_split``) and its ``names``
    directories linked in: variants that differ in a later stage train beside one fit of the earlier ones."""
    directory.mkdir(parents=True, exist_ok=True)
    share_split(artifact_dir, directory)
    for name in names:
        link, target = directory / name, (Path(artifact_dir) / name).resolve()
        if not target.is_dir():
            raise FileNotFoundError(f"{target} missing: train it in {artifact_dir} first")
        if link.is_symlink() and link.resolve() == target:
            continue
        if link.is_symlink():
            link.unlink()
        if link.exists():
            raise ValueError(f"{link} exists and is not a link to {target}: remove it")
        os.symlink(target, link)


def mean_sd(values: list[float]) -> dict[str, float]:
    """Mean and sample sd (0 for one value), rounded to 5 places: the spread over seeds.

    >>> mean_sd([0.1, 0.3])
    {'mean': 0.2, 'sd': 0.14142}
    """
    arr = np.asarray(values, dtype=np.float64)
    return {"mean": round(float(arr.mean()), 5), "sd": round(float(arr.std(ddof=1)) if len(arr) > 1 else 0.0, 5)}


def evaluate_seeds(
    settings: Settings, artifact_dir: Path, split: Split, *, n_seeds: int, stages: tuple[str, ...],
    phase: str = "test", retrain: bool = False, progress: bool = True,
) -> dict[str, Any]:
    """Train and evaluate once per seed (see module doc); the summary report."""
    per_seed: dict[int, dict[str, Any]] = {}
    for seed, directory in seed_dirs(artifact_dir, settings.seed, n_seeds):
        share_split(artifact_dir, directory)
        seeded = settings.model_copy(update={"seed": seed})
        trained = train_stages(seeded, directory, split, stages=stages, force=retrain, progress=progress)
        report = evaluate_pipeline(seeded, directory, split, phase=phase, progress=progress)  # type: ignore[arg-type]
        report["train_s"] = {k: v.get("seconds") for k, v in trained.items()}
        # `recsys eval` prints them, as for one seed
        report["warnings"] = training_warnings(seeded, trained) + baseline_warnings(report)
        report["recall_train"] = fit_summary(trained)
        report["choices"] = served_choices(seeded, directory)
        coarse = trained.get("coarse", {})
        report["coarse_importance"] = coarse.get("feature_importance_gain", coarse.get("feature_importance_top10"))
        atomic_write_json(directory / f"eval_{phase}.json", report, default=str)
        per_seed[seed] = report
    return {"dataset": split.name, "n_users": split.n_users, "n_items": split.n_items, "phase": phase,
            "seeds": list(per_seed), "artifacts": str(artifact_dir),
            "summary": summarize(per_seed), "per_seed": {s: _compact(r) for s, r in per_seed.items()}}


def summarize(per_seed: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """``{"<section>.<path>": {"mean", "sd", "values"}}`` over the seeds for every numeric leaf.

    >>> summarize({1: {"stages": {"coarse": {"ndcg@10": 0.1}}}, 2: {"stages": {"coarse": {"ndcg@10": 0.2}}}})
    {'stages.coarse.ndcg@10': {'mean': 0.15, 'sd': 0.07071, 'values': [0.1, 0.2]}}
    """
    flat = [dict(_leaves({k: r[k] for k in SUMMARISED if k in r})) for r in per_seed.values()]
    keys = [k for k in flat[0] if all(k in f for f in flat)] if flat else []
    out: dict[str, Any] = {}
    for key in keys:
        values = np.array([f[key] for f in flat], dtype=np.float64)
        sd = float(values.std(ddof=1)) if len(values) > 1 else 0.0
        out[key] = {"mean": round(float(values.mean()), 5), "sd": round(sd, 5), "values": [round(float(v), 5) for v in values]}
        if key.startswith("deltas.") and key.endswith(".mean"):
            out[key]["beyond_sd"] = bool(abs(values.mean()) > sd)
    return out


def _leaves(tree: Any, prefix: str = "") -> Any:
    """(dotted path, float) for every int/float leaf of nested dicts (lists and strings skipped)."""
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _leaves(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(tree, int | float) and not isinstance(tree, bool) and tree is not None:
        yield prefix, float(tree)


def _compact(report: dict[str, Any]) -> dict[str, Any]:
    keep = (*SUMMARISED, "recall_train", "choices", "coarse_importance", "llm_sources", "lists", "warnings", "timings")
    return {k: report[k] for k in keep if k in report}
