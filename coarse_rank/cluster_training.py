"""The coarse ranker's training on a Ray cluster: query groups and feature rows as Ray Data batches,
LightGBM data-parallel through Ray Train.

``coarse_rank.train.train_coarse`` calls these when it is given a cluster (``recsys.cluster``):

- ``groups_on_cluster``: the recall stage answers each training query (``coarse_rank.dataset.
  query_inputs``) inside a pool of Ray Data actors, one consecutive block of queries per call,
  the stage shipped once through the object store. Blocks come back in order, so the groups are
  those of ``coarse_rank.dataset.build_groups``, query for query.
- ``features_on_cluster``: the fitted ``FeatureBuilder`` turns each block of groups into its
  feature rows on the actors; the rows, stacked in order, are those of the single-process pass.
- ``fit_on_cluster``: ``ray.train.lightgbm.LightGBMTrainer`` runs ``lightgbm.train`` on
  ``num_workers`` workers with LightGBM's data-parallel tree learner. Each worker holds whole
  query groups (a LambdaRank group must not straddle two workers, so the rows are cut at group
  boundaries here rather than by Ray Data's row split) and every worker holds the whole valid
  set, so all of them see the same early-stopping metric and stop at the same round. The
  histograms are summed over workers but the feature bins are found from the workers' own rows,
  so the trees are close to, not bit-for-bit those of, the single-process fit. The categorical
  columns are split as numeric codes on the cluster (LightGBM's data-parallel learner crashes on
  categorical features), one more reason the trees differ.

Deliberately left out: streaming the feature rows to the training workers without the driver
(the driver holds them once, as in the single-process fit) and GPU training.
"""

from __future__ import annotations

import pickle
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from coarse_rank.dataset import QueryGroups, QueryPhase, query_inputs
from coarse_rank.features import FeatureBuilder
from offline.split import Split
from recsys.cluster import ClusterConfig
from recsys.contract import Candidates, Stage
from recsys.progress import progress_bar

BLOCKS_PER_WORKER = 4  # more blocks than workers, so a slow block does not leave the others idle


def _blocks(n: int, cluster: ClusterConfig) -> list[tuple[int, int]]:
    """Consecutive (start, stop) runs covering ``range(n)``, ``BLOCKS_PER_WORKER`` per worker.

    >>> _blocks(10, ClusterConfig(num_workers=2))
    [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10)]
    """
    size = max(1, -(-n // (cluster.num_workers * BLOCKS_PER_WORKER)))
    return [(lo, min(lo + size, n)) for lo in range(0, n, size)]


class _CandidateActor:
    """Ray Data callable class: the recall stage and the split, fetched once per actor."""

    def __init__(self, refs: list[Any], phase: QueryPhase) -> None:
        import ray  # lazy: heavy optional dependency; this class only runs inside Ray workers

        self.split, stage = ray.get(refs)
        self.stage: Stage = stage if hasattr(stage, "run") else stage()  # a recipe builds it here
        self.phase = phase

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        requests, cands = [], []
        for u, hist in zip(batch["user"], batch["history"], strict=True):
            req = self.split.request(int(u), np.asarray(hist, np.int64), k=10, request_id=f"coarse-{self.phase}-{u}")
            requests.append(req)
            cands.append(self.stage.run(req, Candidates.empty()))
        return {"first": batch["row"][:1], "out": np.array([pickle.dumps((requests, cands))], dtype=object)}


class _FeatureActor:
    """Ray Data callable class: the fitted feature builder, fetched once per actor."""

    def __init__(self, refs: list[Any]) -> None:
        import ray  # lazy: heavy optional dependency; this class only runs inside Ray workers

        self.builder: FeatureBuilder = ray.get(refs[0])

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        pairs = pickle.loads(batch["groups"][0])
        x = np.vstack([self.builder.transform(r, c) for r, c in pairs]) if pairs else None
        return {"first": batch["first"], "out": np.array([pickle.dumps(x)], dtype=object)}


def _ordered(ds: Any, total: int, desc: str, progress: bool) -> list[Any]:
    """Each block's unpickled ``out``, in block order."""
    got = []
    with progress_bar(total=total, desc=desc, unit="block", enabled=progress) as bar:
        for row in ds.iter_rows():
            got.append((int(row["first"]), pickle.loads(row["out"])))
            bar.update(1)
    return [out for _, out in sorted(got, key=lambda r: r[0])]


def groups_on_cluster(split: Split, stage: Stage | Callable[[], Stage], phase: QueryPhase, cluster: ClusterConfig,
                      *, users: Sequence[int] | np.ndarray | None = None, positions: int = 1,
                      progress: bool = True) -> QueryGroups:
    """``coarse_rank.dataset.build_groups`` with the stage run on the cluster's actors (same groups).

    ``stage``: the stage itself (shipped through the object store) or a picklable recipe that
    builds it on each actor (a stage holding a TorchScript module cannot be pickled)."""
    import ray  # lazy: heavy optional dependency, only when a cluster is configured

    pool, histories, labels = query_inputs(split, phase, users, positions)
    if len(pool) == 0:
        return QueryGroups(phase, [], [], labels)
    blocks = [pd.DataFrame({"row": np.arange(lo, hi), "user": pool[lo:hi], "history": histories[lo:hi]})
              for lo, hi in _blocks(len(pool), cluster)]
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    ds = ray.data.from_pandas(blocks).map_batches(
        _CandidateActor, fn_constructor_kwargs={"refs": [ray.put(split), ray.put(stage)], "phase": phase},
        batch_size=None, batch_format="numpy", concurrency=min(cluster.num_workers, len(blocks)),
        num_cpus=cluster.cpus_per_worker)
    parts = _ordered(ds, len(blocks), f"coarse {phase} candidates (ray)", progress)
    return QueryGroups(phase, [r for reqs, _ in parts for r in reqs], [c for _, cands in parts for c in cands],
                       labels)


def features_on_cluster(builder: FeatureBuilder, groups: QueryGroups, cluster: ClusterConfig,
                        progress: bool = True) -> np.ndarray:
    """The stacked feature rows of ``groups`` (``FeatureBuilder.transform`` per group) built on the actors."""
    import ray  # lazy: heavy optional dependency, only when a cluster is configured

    pairs = list(zip(groups.requests, groups.candidates, strict=True))
    blocks = [pd.DataFrame({"first": [lo], "groups": [pickle.dumps(pairs[lo:hi])]})
              for lo, hi in _blocks(len(pairs), cluster)]
    if not blocks:
        return np.zeros((0, len(builder.feature_names)), np.float32)
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    ds = ray.data.from_pandas(blocks).map_batches(
        _FeatureActor, fn_constructor_kwargs={"refs": [ray.put(builder)]}, batch_size=None, batch_format="numpy",
        concurrency=min(cluster.num_workers, len(blocks)), num_cpus=cluster.cpus_per_worker)
    return np.vstack([x for x in _ordered(ds, len(blocks), f"coarse {groups.phase} features (ray)", progress)
                      if x is not None])


def group_shards(sizes: np.ndarray, n_shards: int) -> list[tuple[int, int]]:
    """(first group, stop group) per shard: consecutive groups, about equal rows, none empty if avoidable.

    >>> group_shards(np.array([5, 5, 5, 5]), 2), group_shards(np.array([9, 1, 1, 1]), 2)
    ([(0, 2), (2, 4)], [(0, 1), (1, 4)])
    >>> group_shards(np.array([1, 1, 1, 30]), 3)
    [(0, 2), (2, 3), (3, 4)]
    """
    if len(sizes) < n_shards:
        raise ValueError(f"{len(sizes)} query groups cannot feed {n_shards} training workers")
    ends = np.cumsum(sizes)
    cuts = (np.searchsorted(ends, ends[-1] * np.arange(1, n_shards) / n_shards, side="left") + 1).tolist()
    for i in range(len(cuts)):  # at least one group per shard, from the front, then from the back
        cuts[i] = max(cuts[i], (cuts[i - 1] if i else 0) + 1)
    for i in reversed(range(len(cuts))):
        cuts[i] = min(cuts[i], (cuts[i + 1] if i + 1 < len(cuts) else len(sizes)) - 1)
    bounds = [0, *cuts, len(sizes)]
    return [(int(a), int(b)) for a, b in zip(bounds, bounds[1:], strict=False)]


def _train_worker(config: dict[str, Any]) -> None:
    """One Ray Train worker: its shard of query groups, the whole valid set, ``lightgbm.train``."""
    import lightgbm as lgb  # lazy: imports lightgbm
    import ray  # lazy: heavy optional dependency; this function only runs inside Ray Train workers
    import ray.train  # lazy: Ray Train loads only on a cluster
    from ray.train.lightgbm import get_network_params  # lazy: Ray Train loads only on a cluster

    rank = ray.train.get_context().get_world_rank()
    x, y, sizes = ray.get(config["shards"][rank])
    x_va, y_va, va_sizes = ray.get(config["valid"])
    names = config["feature_names"]
    params = {**config["params"], "tree_learner": "data_parallel", "pre_partition": True, **get_network_params()}
    # categorical columns are split as numeric codes here: LightGBM's data-parallel learner crashes
    # (SIGSEGV while the workers build the dataset) on categorical features (LightGBM 4.x, 2 workers, ML-100K)
    train = lgb.Dataset(x, y, group=sizes, feature_name=names, categorical_feature=[])
    valid = lgb.Dataset(x_va, y_va, group=va_sizes, reference=train, feature_name=names, categorical_feature=[])
    booster = lgb.train(params, train, valid_sets=[valid], valid_names=["valid"],
                        callbacks=[lgb.early_stopping(config["early_stopping_rounds"], verbose=False)])
    best = int(booster.best_iteration or booster.current_iteration())
    if rank == 0:
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "model.txt").write_text(booster.model_to_string(num_iteration=best))
            ray.train.report({"best_iteration": best}, checkpoint=ray.train.Checkpoint.from_directory(tmp))
    else:
        ray.train.report({"best_iteration": best})


def fit_on_cluster(x: np.ndarray, y: np.ndarray, sizes: np.ndarray, x_va: np.ndarray, y_va: np.ndarray,
                   va_sizes: np.ndarray, *, params: dict[str, Any], feature_names: list[str],
                   categorical: list[str], early_stopping_rounds: int, eval_at: int, cluster: ClusterConfig,
                   storage: Path) -> tuple[Any, int]:
    """(booster cut at its best round, best round) of a data-parallel LambdaRank fit on the cluster.

    ``params``: ``coarse_rank.train.lgbm_params`` (LightGBM reads its scikit-learn names as
    aliases); each worker uses ``cpus_per_worker`` threads. ``categorical`` columns are fitted as
    numeric codes (see ``_train_worker``). ``storage``: where Ray Train keeps the
    run and its checkpoint (on a multi-node cluster, a path every node sees)."""
    import lightgbm as lgb  # lazy: imports lightgbm
    import ray  # lazy: heavy optional dependency, only when a cluster is configured
    from ray.train import RunConfig, ScalingConfig  # lazy: Ray Train loads only on a cluster
    from ray.train.lightgbm import LightGBMTrainer  # lazy: Ray Train loads only on a cluster

    offsets = np.concatenate([[0], np.cumsum(sizes)])
    shards = [ray.put((x[offsets[a]:offsets[b]], y[offsets[a]:offsets[b]], sizes[a:b]))
              for a, b in group_shards(sizes, cluster.num_workers)]
    run_params = {**params, "n_jobs": cluster.cpus_per_worker, "metric": "ndcg", "eval_at": [eval_at]}
    trainer = LightGBMTrainer(
        _train_worker,
        train_loop_config={"shards": shards, "valid": ray.put((x_va, y_va, va_sizes)), "params": run_params,
                           "feature_names": feature_names,
                           "early_stopping_rounds": early_stopping_rounds},
        scaling_config=ScalingConfig(num_workers=cluster.num_workers,
                                     resources_per_worker={"CPU": cluster.cpus_per_worker}),
        run_config=RunConfig(storage_path=str(Path(storage).resolve()), name="coarse_lightgbm"),
    )
    result = trainer.fit()
    if result.checkpoint is None or result.metrics is None:
        raise RuntimeError(f"the coarse ranker's fit on the cluster returned no model ({result.error!r})")
    with result.checkpoint.as_directory() as path:
        booster = lgb.Booster(model_file=str(Path(path) / "model.txt"))
    return booster, int(result.metrics["best_iteration"])
