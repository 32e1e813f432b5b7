"""Training the coarse ranker: LightGBM LambdaRank over recall candidates.

LambdaRank (Burges, "From RankNet to LambdaRank to LambdaMART: An Overview", MSR-TR-2010-82)
weights each pairwise gradient by the NDCG change of swapping the pair, so the booster
optimises the top of each user's list directly. Query groups (see
``coarse_rank.dataset``): train groups label each of a user's last ``train_positions``
training items given the items before it; early stopping watches NDCG@``eval_at`` on the valid phase. ``split.test``
is never read.

Artifacts written to ``out_dir``: ``model.txt`` (the booster cut at its best iteration) and, with
``coarse.ensemble`` above 1, ``model-1.txt``, ... (the same setting fitted at the next seeds; the
stage serves the mean of their scores),
``features.npz`` + ``features.json`` (the builder fitted on all training interactions, used
at serving and on valid), ``meta.json`` (written last: the report, parameters, seed).

Deliberately left out: candidate generation (any ``recsys.contract.Stage``), serving
(``coarse_rank.stage``), test-set evaluation (the offline evaluator).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from coarse_rank.cluster_training import features_on_cluster, fit_on_cluster, groups_on_cluster
from coarse_rank.cold_training import cold_item_variants, cold_items_for_training, variant_label
from coarse_rank.config import CoarseConfig
from coarse_rank.dataset import QueryGroups, QueryPhase, build_groups, channel_columns, training_prefix
from coarse_rank.feature_names import CATEGORICAL_FEATURES
from coarse_rank.feature_store import save_builder
from coarse_rank.features import FeatureBuilder, check_tags
from coarse_rank.gates import choose_dropout, choose_placement, per_group_ndcg, valid_ndcg
from coarse_rank.item_tags import ItemTags
from coarse_rank.llm_features import ItemEmbeddings, check_embeddings
from coarse_rank.llm_gate import choose_llm_features, fixed_choice, without_llm
from offline.protocol import SALT_COARSE_TRAIN, SALT_COARSE_VALID, user_sample
from offline.split import Split
from recsys.atomic import atomic_write_json
from recsys.cluster import ClusterConfig, ray_session
from recsys.contract import Stage
from recsys.progress import progress_bar

LLM_GATE_FITS = 3  # coarse.llm_embedding_features auto: seeds each side of the LLM-column verdict is fitted at


def lgbm_params(config: CoarseConfig, seed: int) -> dict[str, Any]:
    """``LGBMRanker`` keyword arguments; deterministic for a seed and thread count."""
    return {
        "objective": "lambdarank",
        "n_estimators": config.n_estimators,
        "learning_rate": config.learning_rate,
        "num_leaves": config.num_leaves,
        "min_child_samples": config.min_child_samples,
        "colsample_bytree": config.feature_fraction,
        "subsample": config.bagging_fraction,
        "subsample_freq": 1 if config.bagging_fraction < 1 else 0,
        "reg_lambda": config.reg_lambda,
        "lambdarank_truncation_level": config.truncation_level,
        "random_state": seed,
        "n_jobs": config.num_threads,
        "deterministic": True,
        "force_row_wise": True,
        "verbose": -1,
    }


def train_coarse(
    split: Split, candidate_stage: Stage, out_dir: Path, config: CoarseConfig, *, seed: int = 42,
    progress: bool = True, tags: ItemTags | None = None, train_stage: Stage | None = None,
    llm: ItemEmbeddings | None = None, cluster: ClusterConfig | None = None,
    worker_stages: Callable[[], tuple[Stage, Stage]] | None = None, llm_missing: str | None = None,
) -> dict[str, Any]:
    """``fit_coarse`` inside a Ray session when ``cluster`` names one (``recsys.cluster``: query groups,
    feature rows and the LightGBM fit then run on it, see ``coarse_rank.cluster_training``), else here.

    ``worker_stages``: a picklable recipe that builds (``candidate_stage``, ``train_stage``) again
    on each cluster worker, for stages that cannot travel through the object store (a TorchScript
    tower); without it the stages themselves are shipped."""
    cluster = cluster if cluster is not None and cluster.enabled else None
    with ray_session(cluster or ClusterConfig()):
        return fit_coarse(split, candidate_stage, out_dir, config, seed=seed, progress=progress, tags=tags,
                          train_stage=train_stage, llm=llm, cluster=cluster, worker_stages=worker_stages,
                          llm_missing=llm_missing)


def fit_coarse(
    split: Split, candidate_stage: Stage, out_dir: Path, config: CoarseConfig, *, seed: int = 42,
    progress: bool = True, tags: ItemTags | None = None, train_stage: Stage | None = None,
    llm: ItemEmbeddings | None = None, cluster: ClusterConfig | None = None,
    worker_stages: Callable[[], tuple[Stage, Stage]] | None = None, llm_missing: str | None = None,
) -> dict[str, Any]:
    """Fit the ranker on ``candidate_stage``'s candidates, save it under ``out_dir``, return a report.

    ``tags``: the item tag tables, required exactly when ``config.tag_features`` (both feature
    builders use them; see ``jobs.coarse_tags`` for leak-free ones); ``llm``: the LLM item
    embeddings (leak-free ones from ``jobs.tagging.embed.coarse_item_embeddings``), required when
    ``config.llm_embedding_features`` is true, refused when false, with ``auto`` served only where they
    lift on valid (``coarse_rank.llm_gate``; ``llm_missing``: the report's why when there are none).
    ``train_stage``: the stage that recalls the train-phase groups when it must differ from the valid
    phase's (default ``candidate_stage``): ``jobs.train`` gives the same recall model with the counts
    of ``coarse_rank.dataset.prefix_popularity``, so no train label's own event is in its popularity.
    """
    check_tags(config, tags, split.n_items)  # fail before the slow candidate pass
    setting = config.llm_embedding_features  # the builders' columns: auto resolved to whether there are embeddings
    fitted = config.model_copy(update={"llm_embedding_features": llm is not None if setting == "auto" else setting})
    check_embeddings(fitted, llm, split.n_items)
    started = time.perf_counter()
    train_stage = candidate_stage if train_stage is None else train_stage
    (tr_all, va_all), sample = _query_groups(split, (train_stage, candidate_stage), config, seed, progress,
                                             (cluster, worker_stages))
    scores, flags = channel_columns([tr_all, va_all])
    prefix = training_prefix(split, config.train_positions)
    prefix_fb = FeatureBuilder(fitted).fit(split, prefix, score_columns=scores, flag_columns=flags, tags=tags, llm=llm)
    builder = FeatureBuilder(fitted).fit(split, score_columns=scores, flag_columns=flags, tags=tags, llm=llm)
    tr, va = tr_all.subset(tr_all.has_positive), va_all.subset(va_all.has_positive)
    for name, g, g_all, stage in (("train", tr, tr_all, train_stage), ("valid", va, va_all, candidate_stage)):
        if len(g) == 0:
            raise ValueError(
                f"train_coarse: none of the {len(g_all)} {name} groups has its label among the candidates "
                f"of stage {stage.name!r}; nothing to learn from"
            )
    x_tr, x_va = _matrix(prefix_fb, tr, progress, cluster), _matrix(builder, va, progress, cluster)
    members, builder, dropout_choice, llm_choice = _chosen_fit((x_tr, x_va), (tr, va), builder, config, seed,
                                                               (cluster, out_dir), llm_missing)
    pred = np.mean([m.pred for m in members], axis=0)  # what the stage serves: the mean of the fits' scores
    new_items = choose_placement(config.new_items, pred, va, builder.known_items(), config.eval_at, seed)
    gain = np.sum([m.booster.feature_importance(importance_type="gain", iteration=m.best) for m in members], axis=0)
    top = np.argsort(-gain, kind="stable")[:10]
    report = {
        "user_sample": sample,
        "engine": f"ray ({cluster.num_workers} workers)" if cluster is not None else "in-process",
        "n_train_queries": len(tr_all),
        "n_train_groups": len(tr),
        "train_positive_share": len(tr) / max(len(tr_all), 1),
        "n_valid_queries": len(va_all),
        "n_valid_groups": len(va),
        "valid_positive_share": len(va) / max(len(va_all), 1),
        "n_train_rows": members[0].n_rows,
        "cold_item_training": members[0].cold_rows,
        "cold_item_dropout": dropout_choice,
        "new_items": new_items,
        "llm_embedding_features": llm_choice,
        "n_features": len(builder.feature_names),
        "best_iteration": members[0].best,
        "ensemble": {"fits": len(members), "seeds": [m.seed for m in members], "files": model_files(len(members)),
                     "best_iterations": [m.best for m in members],
                     "valid_ndcg_per_fit": [round(valid_ndcg(va, m.pred, config.eval_at, len(va_all))[
                         f"valid_ndcg@{config.eval_at}_coarse"], 5) for m in members]},
        **valid_ndcg(va, pred, config.eval_at, n_users=len(va_all)),
        "feature_importance_top10": {builder.feature_names[i]: round(float(gain[i]), 3) for i in top},
        "feature_importance_gain": importance_table(builder.feature_names, gain),
        "seconds": round(time.perf_counter() - started, 2),
    }
    _save(out_dir, members, builder, report, builder.config, seed, split)  # as fitted: never auto
    return report


@dataclass
class _Fit:
    booster: Any
    best: int
    pred: np.ndarray  # valid scores at the best iteration
    cold_rows: dict[str, Any]
    n_rows: int
    seed: int


def _chosen_fit(x: tuple[np.ndarray, np.ndarray], groups: tuple[QueryGroups, QueryGroups], builder: FeatureBuilder,
                config: CoarseConfig, seed: int, on: tuple[ClusterConfig | None, Path], llm_missing: str | None
                ) -> tuple[list[_Fit], FeatureBuilder, dict[str, Any], dict[str, Any]]:
    """(the served fits, their builder, the cold-item dropout report, the LLM feature report) from the
    (train, valid) matrices and groups of ``builder``. The dropout is chosen first (``choose_dropout``); with
    ``auto`` and embeddings, without the LLM columns, and the fit with them at that dropout is then
    served only where it wins ``coarse_rank.llm_gate.choose_llm_features`` on the valid groups, each side's
    per-group NDCG averaged over ``LLM_GATE_FITS`` fit seeds. The chosen setting is served as
    ``config.ensemble`` fits at seeds ``seed``, ``seed + 1``, ... (the gate's fits reused)."""
    (x_tr, x_va), (tr, va) = x, groups
    gated, with_llm = config.llm_embedding_features == "auto" and builder.llm is not None, builder
    if gated:
        builder, keep = without_llm(with_llm)
        x_tr, x_va = x_tr[:, keep], x_va[:, keep]
    variants = cold_item_variants(config)
    fits = [_fit_ranker(x_tr, tr, builder, v, config, seed, x_va, va, on) for v in variants]
    chosen, dropout_choice = choose_dropout([variant_label(v) for v in variants], [f.pred for f in fits], va,
                                            config.eval_at, seed)
    d = variants[chosen]

    def members(first: list[_Fit], xs: tuple[np.ndarray, np.ndarray], served: FeatureBuilder) -> list[_Fit]:
        return first[:config.ensemble] + [_fit_ranker(xs[0], tr, served, d, config, seed + i, xs[1], va, on)
                                          for i in range(len(first), config.ensemble)]

    if not gated:
        return members([fits[chosen]], (x_tr, x_va), builder), builder, dropout_choice, fixed_choice(config, llm_missing)
    # both sides fitted at LLM_GATE_FITS seeds and each group's NDCG averaged: with row and column
    # sampling one fit's luck decides, and the mean over seeds keeps noise out and lets a real lift in
    challengers = [_fit_ranker(x[0], tr, with_llm, d, config, seed + i, x[1], va, on) for i in range(LLM_GATE_FITS)]
    incumbents = [fits[chosen]] + [_fit_ranker(x_tr, tr, builder, d, config, seed + i, x_va, va, on)
                                   for i in range(1, LLM_GATE_FITS)]
    without, with_them = (np.mean([per_group_ndcg(va, f.pred, config.eval_at) for f in side], axis=0)
                          for side in (incumbents, challengers))
    llm_choice = choose_llm_features(without, with_them, config.eval_at, seed)
    llm_choice.update(dropout=variant_label(d), fit_seeds=[seed + i for i in range(LLM_GATE_FITS)])
    if llm_choice["chosen"]:
        return members(challengers, x, with_llm), with_llm, dropout_choice, llm_choice
    return members(incumbents, (x_tr, x_va), builder), builder, dropout_choice, llm_choice


def _fit_ranker(x_tr: np.ndarray, tr: QueryGroups, builder: FeatureBuilder, variant: tuple[float, float],
                config: CoarseConfig, seed: int, x_va: np.ndarray, va: QueryGroups,
                on: tuple[ClusterConfig | None, Path] = (None, Path("."))) -> _Fit:
    """One LambdaRank fit at one cold-item ``variant`` (dropout, young copies), early-stopped on the valid
    groups; ``on``: (the cluster to fit on, data-parallel, or None for this process; the directory its
    run is kept under)."""
    import lightgbm as lgb  # lazy: imports lightgbm

    x, y, sizes, cold_rows = cold_items_for_training(x_tr, tr, builder.known_items(), builder, variant[0], seed,
                                                     young=variant[1])
    if on[0] is not None:
        booster, best = fit_on_cluster(
            x, y, sizes, x_va, va.relevance().astype(np.int32), va.sizes, params=lgbm_params(config, seed),
            feature_names=builder.feature_names, categorical=list(CATEGORICAL_FEATURES),
            early_stopping_rounds=config.early_stopping_rounds, eval_at=config.eval_at, cluster=on[0],
            storage=Path(on[1]) / ".ray_train")
        pred = np.asarray(booster.predict(x_va, num_iteration=best, num_threads=config.num_threads))
        return _Fit(booster, best, pred, cold_rows, int(len(x)), seed)
    ranker = lgb.LGBMRanker(**lgbm_params(config, seed))
    ranker.fit(
        x, y, group=sizes,
        eval_X=(x_va,), eval_y=(va.relevance().astype(np.int32),), eval_group=[va.sizes], eval_at=[config.eval_at],
        feature_name=builder.feature_names, categorical_feature=list(CATEGORICAL_FEATURES),
        callbacks=[lgb.early_stopping(config.early_stopping_rounds, verbose=False)],
    )
    booster = ranker.booster_
    best = int(ranker.best_iteration_ or booster.current_iteration())
    pred = np.asarray(booster.predict(x_va, num_iteration=best, num_threads=config.num_threads))
    return _Fit(booster, best, pred, cold_rows, int(len(x)), seed)


def model_files(n: int) -> list[str]:
    """The file names of ``n`` ensemble members' boosters, the first fit's first.

    >>> model_files(3)
    ['model.txt', 'model-1.txt', 'model-2.txt']
    """
    return ["model.txt", *(f"model-{i}.txt" for i in range(1, n))]


def importance_table(names: list[str], gain: np.ndarray) -> dict[str, dict[str, float]]:
    """Every feature's total split gain and its share of the total, largest first (ties by name order).

    >>> importance_table(["a", "b", "c"], np.array([1.0, 3.0, 0.0]))
    {'b': {'gain': 3.0, 'share': 0.75}, 'a': {'gain': 1.0, 'share': 0.25}, 'c': {'gain': 0.0, 'share': 0.0}}
    """
    total = float(gain.sum()) or 1.0
    return {names[i]: {"gain": round(float(gain[i]), 3), "share": round(float(gain[i]) / total, 4)}
            for i in np.argsort(-gain, kind="stable")}


def user_sample_note(n_users: int, sample: np.ndarray | None, setting: str) -> str:
    """What a user cap did, in one line for the training report.

    >>> user_sample_note(24998, np.arange(10000), "coarse.max_train_users")
    'sampled 10,000 of 24,998 users (coarse.max_train_users)'
    >>> user_sample_note(943, None, "coarse.max_train_users")
    'all 943 users (coarse.max_train_users not reached)'
    """
    if sample is None:
        return f"all {n_users:,} users ({setting} not reached)"
    return f"sampled {len(sample):,} of {n_users:,} users ({setting})"


def nth_stage(recipe: Callable[[], tuple[Stage, Stage]], i: int) -> Stage:
    """Stage ``i`` of what ``recipe`` builds (``train_coarse``'s ``worker_stages``, on a worker)."""
    return recipe()[i]


def _query_groups(split: Split, stages: tuple[Stage, Stage], config: CoarseConfig, seed: int, progress: bool,
                  on: tuple[ClusterConfig | None, Callable[[], tuple[Stage, Stage]] | None]
                  ) -> tuple[tuple[QueryGroups, QueryGroups], dict[str, str]]:
    """((train groups, valid groups), what the user caps sampled) from (train stage, valid stage)."""
    tr_users, va_users = (_users(split, config.max_train_users, seed, SALT_COARSE_TRAIN),
                          _users(split, config.max_valid_users, seed, SALT_COARSE_VALID))
    groups = (_groups(split, stages[0], "train", tr_users, config.train_positions, progress, on),
              _groups(split, stages[1], "valid", va_users, 1, progress, on))
    return groups, {"train": user_sample_note(split.n_users, tr_users, "coarse.max_train_users"),
                    "valid": user_sample_note(split.n_users, va_users, "coarse.max_valid_users")}


def _groups(split: Split, stage: Stage, phase: QueryPhase, users: np.ndarray | None, positions: int, progress: bool,
            on: tuple[ClusterConfig | None, Callable[[], tuple[Stage, Stage]] | None]) -> QueryGroups:
    """The query groups of ``phase``: recalled here, or on the cluster ``on[0]``'s actors, with ``stage``
    shipped or, given a recipe ``on[1]`` (``train_coarse``'s ``worker_stages``), built there."""
    cluster, recipe = on
    if cluster is None:
        return build_groups(split, stage, phase, users=users, progress=progress, positions=positions)
    shipped = stage if recipe is None else partial(nth_stage, recipe, 1 if phase == "train" else 0)
    return groups_on_cluster(split, shipped, phase, cluster, users=users, positions=positions, progress=progress)


def _users(split: Split, cap: int | None, seed: int, salt: int) -> np.ndarray | None:
    """A seeded sample of ``cap`` users (``offline.protocol.user_sample``); None (every user) below it."""
    return None if cap is None or cap >= split.n_users else user_sample(np.arange(split.n_users), cap, seed, salt=salt)


def _matrix(builder: FeatureBuilder, groups: QueryGroups, progress: bool, cluster: ClusterConfig | None = None
            ) -> np.ndarray:
    if cluster is not None:
        return features_on_cluster(builder, groups, cluster, progress)
    pairs = progress_bar(list(zip(groups.requests, groups.candidates, strict=True)),
                         desc=f"coarse {groups.phase} features", enabled=progress, unit="user")
    return np.vstack([builder.transform(r, c) for r, c in pairs])


def _save(out_dir: Path, members: list[_Fit], builder: FeatureBuilder, report: dict[str, Any],
          config: CoarseConfig, seed: int, split: Split) -> None:
    import lightgbm as lgb  # lazy: imports lightgbm

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "meta.json").unlink(missing_ok=True)  # meta.json marks a complete artifact: written last
    files = model_files(len(members))
    for stale in set(p.name for p in out_dir.glob("model-*.txt")) - set(files):  # a larger ensemble's leftovers
        (out_dir / stale).unlink()
    for name, member in zip(files, members, strict=True):
        member.booster.save_model(str(out_dir / f".{name}.tmp"), num_iteration=member.best)
        (out_dir / f".{name}.tmp").replace(out_dir / name)
    save_builder(builder, out_dir)
    meta = {"dataset": split.name, "seed": seed, "lightgbm": lgb.__version__, "config": config.model_dump(),
            "params": lgbm_params(config, seed), "feature_names": builder.feature_names, "report": report}
    atomic_write_json(out_dir / "meta.json", meta)
