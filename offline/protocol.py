"""The evaluation protocol: k-core filtering and the leave-one-out split.

This is the protocol LlamaRec (Yue et al., 2023) and LRURec (Yue et al., 2024) report on, so
our numbers compare with theirs: iterative 5-core filtering, each user's interactions in time
order, last -> test, second last -> valid, the rest -> train, full ranking over the catalog
with the user's input history excluded.

Rules fixed here (and recorded in ``Split.protocol``):

- duplicates: repeated (user, item) pairs are collapsed to the latest one (largest timestamp,
  then last row) *before* filtering, so a re-watch counts once (ML-100K has none);
- tie-break: interactions with equal timestamps keep their order in the input table;
- encoding: ``item_idx`` follows the items-table order restricted to surviving items;
  ``user_idx`` follows the users-table order, then users absent from it in order of first
  appearance in the interactions (they get an empty attribute row);
- short users: a user needs >= 3 interactions (train, valid, test); with ``k < 3`` shorter
  users are filtered with the k-core (users need max(k, 3), items need k);
- users outside the k-core (too few events, or listed in the users table with none) are not
  evaluated, but serving must still know them: ``Split.outside`` keeps their attributes and
  their history on the catalog's items (``outside_users``), so an adult with three purchases
  is not served as an anonymous stranger; the protocol records how many users and items the
  filter left out (``n_users_outside``, ``n_items_outside``);
- catalog: the items the k-core keeps (``catalog="interacted"``, the published protocols'
  catalog). ``catalog="listed"`` adds every item the items table lists that no interaction
  names, after them (so the kept items' indices do not move): new items the two-tower places by
  their content alone, ranked among the rest in evaluation too (never a target). An item with
  events the k-core removed stays out either way (its events are gone from the users'
  histories, so serving could not tell who already has it); a lower ``k_core`` keeps it.

Deliberately left out: metrics (``offline.metrics``), baselines (``offline.baselines``),
reading files (``offline.loaders``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from offline.bootstrap import paired_bootstrap
from offline.schema import DataError, Dataset, Vocab, normalise_users
from offline.split import Split
from recsys.names import canonical

MIN_USER_INTERACTIONS = 3  # one train, one valid, one test


def k_core(interactions: pd.DataFrame, k: int = 5, *, min_user: int | None = None) -> pd.DataFrame:
    """Keep the largest sub-table where every user and every item has >= ``k`` interactions.

    Exact duplicate (user_id, item_id) pairs are first collapsed to the latest one. Removing a
    sparse item can push a user below ``k`` (and so on), hence the loop until nothing changes.
    ``min_user`` overrides the user threshold (``make_split`` uses max(k, 3)). Rows keep their
    input order and index labels.

    >>> df = pd.DataFrame({"user_id": ["a", "a", "b"], "item_id": ["x", "y", "x"]})
    >>> k_core(df, k=2)["user_id"].tolist()
    []
    """
    if k < 1:
        raise ValueError(f"k_core: k must be >= 1, got {k}")
    user_k = k if min_user is None else min_user
    for col in ("user_id", "item_id"):
        if col not in interactions.columns:
            raise DataError(f"k_core: interactions lack column {col!r}")
    users, _ = pd.factorize(interactions["user_id"])
    items, item_uniques = pd.factorize(interactions["item_id"])
    keep = _latest_per_pair(interactions, users, items, len(item_uniques))
    while True:
        u_count = np.bincount(users[keep], minlength=users.max(initial=-1) + 1)
        i_count = np.bincount(items[keep], minlength=len(item_uniques))
        ok = keep & (u_count[users] >= user_k) & (i_count[items] >= k)
        if ok.sum() == keep.sum():
            break
        keep = ok
    return interactions.loc[keep]


_k_core_fn = k_core  # ``make_split``'s parameter ``k_core`` shadows the function name


def _latest_per_pair(df: pd.DataFrame, users: np.ndarray, items: np.ndarray, n_items: int) -> np.ndarray:
    """Bool mask keeping, per (user, item) pair, the row with the latest (timestamp, row)."""
    pair = users.astype(np.int64) * max(n_items, 1) + items
    pos = np.arange(len(df))
    ts = df["timestamp"].to_numpy(np.int64) if "timestamp" in df else pos
    order = np.lexsort((pos, ts, pair))  # within a pair: by time, then row; last one wins
    last = np.ones(len(order), dtype=bool)
    last[:-1] = pair[order][1:] != pair[order][:-1]
    keep = np.zeros(len(df), dtype=bool)
    keep[order[last]] = True
    return keep


CATALOGS = ("interacted", "listed")


def make_split(ds: Dataset, k_core: int = 5, catalog: str = "interacted") -> Split:
    """Filter ``ds`` to its ``k_core``, encode to contiguous indices and split leave-one-out.

    Called once per dataset by ``recsys prepare``; every trainer and evaluator then loads the
    saved ``Split``. See the module docstring for the duplicate, tie and ordering rules.
    """
    k = k_core  # the parameter is named after the protocol key, the function is ``_k_core_fn``
    if k < 1:
        raise ValueError(f"make_split: k_core must be >= 1, got {k}")
    if catalog not in CATALOGS:
        raise ValueError(f"make_split: catalog must be one of {', '.join(CATALOGS)}, got {catalog!r}")
    inter = ds.interactions.reset_index(drop=True)
    user_k = max(k, MIN_USER_INTERACTIONS)
    kept = _k_core_fn(inter, k, min_user=user_k)
    n_short = 0
    if user_k > k:  # only then can the split itself drop users: count them for the record
        n_short = _k_core_fn(inter, k)["user_id"].nunique() - kept["user_id"].nunique()
    if kept.empty:
        raise DataError(f"make_split: dataset {ds.name!r} is empty after {k}-core filtering")

    items = _encoded_items(ds, kept)
    n_new = 0
    if catalog == "listed":  # items no event names, after the kept ones: their indices do not move
        new = ds.items.loc[~ds.items["item_id"].isin(inter["item_id"])]
        items, n_new = pd.concat([items, new], ignore_index=True), len(new)
    users = _encoded_users(ds, kept)
    user_idx, item_idx, ts, rating = _ordered_events(kept, users["user_id"], items["item_id"])
    ends = np.cumsum(np.bincount(user_idx, minlength=len(users)))
    test_rows, valid_rows = ends - 1, ends - 2
    train_mask = np.ones(len(user_idx), dtype=bool)
    train_mask[test_rows] = False
    train_mask[valid_rows] = False
    train = pd.DataFrame({"user_idx": user_idx[train_mask], "item_idx": item_idx[train_mask],
                          "rating": rating[train_mask], "timestamp": ts[train_mask]})
    outside = outside_users(ds, users["user_id"], items["item_id"])
    protocol = {
        "k_core": k, "split": "leave-one-out", "ranking": "full", "exclude": "history",
        "dedup": "latest (user, item) kept", "tie_break": "timestamp, then input row order",
        "min_user_interactions": user_k, "n_users_dropped_short": int(n_short),
        "n_interactions": len(user_idx), "n_users": len(users), "n_items": len(items),
        "n_interactions_raw": len(inter),
        # left out by the filter: outside users are served from Split.outside, outside items not at all
        "n_users_outside": len(outside), "n_items_outside": int(len(ds.items) - len(items)),
        # recorded only when not the default, so a split prepared before the option keeps its id
        **({"catalog": catalog, "n_items_without_events": n_new} if catalog != "interacted" else {}),
        # any numeric scale is accepted: every interaction counts as one positive (implicit feedback)
        "rating_scale": [float(rating.min()), float(rating.max())] if len(rating) else None,
    }
    return Split(
        name=ds.name, vocab=Vocab.build(users["user_id"], items["item_id"]),
        items=items, users=users, train=train,
        valid=item_idx[valid_rows], test=item_idx[test_rows],
        valid_ts=ts[valid_rows], test_ts=ts[test_rows], protocol=protocol, outside=outside,
    )


def _ordered_events(kept: pd.DataFrame, user_ids: pd.Series, item_ids: pd.Series
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(user_idx, item_idx, timestamp, rating) of the ``kept`` events, ordered by user, then time,
    then position in the input table (the tie-break)."""
    item_idx = pd.Index(item_ids).get_indexer(kept["item_id"]).astype(np.int64)
    user_idx = pd.Index(user_ids).get_indexer(kept["user_id"]).astype(np.int64)
    ts = kept["timestamp"].to_numpy(np.int64)
    rows = kept.index.to_numpy(np.int64)  # positions in the input table: the tie-break
    order = np.lexsort((rows, ts, user_idx))
    return user_idx[order], item_idx[order], ts[order], kept["rating"].to_numpy(np.float32)[order]


def outside_users(ds: Dataset, kept_users: pd.Series, catalog: pd.Series) -> pd.DataFrame:
    """The users of ``ds`` (log or users table) that are not ``kept_users``: their canonical
    users-table row plus ``history``, their item indices in ``catalog`` order oldest first
    (duplicates collapsed to the latest, ties in input order, items outside the catalog
    dropped), for serving; users-table order, then first appearance in the log.

    >>> ds = Dataset("d", pd.DataFrame({"user_id": ["a", "b", "b", "b"], "item_id": ["x", "y", "x", "y"],
    ...                                 "rating": 1.0, "timestamp": [1, 1, 2, 3]}),
    ...              pd.DataFrame({"item_id": ["x", "y", "z"]}), pd.DataFrame({"user_id": ["c", "b"], "age": [40, 30]}))
    >>> out = outside_users(ds, pd.Series(["a"]), pd.Series(["x", "y"]))
    >>> out["user_id"].tolist(), [h.tolist() for h in out["history"]], out["age"].tolist()
    (['c', 'b'], [[], [0, 1]], [40, 30])
    """
    # the loaders give ids in the one spelling (recsys.names); a split saved before they did may hold another
    kept_users, catalog = pd.Series(kept_users).map(canonical), pd.Series(catalog).map(canonical)
    inter = ds.interactions.reset_index(drop=True)
    inter = inter.loc[~inter["user_id"].isin(kept_users)]
    users = ds.users
    listed = users.loc[~users["user_id"].isin(kept_users), "user_id"]
    order = pd.Index(pd.unique(pd.concat([listed, inter["user_id"]], ignore_index=True)), name="user_id")
    table = normalise_users(users.drop_duplicates("user_id").set_index("user_id").reindex(order).reset_index())
    inter = inter.loc[inter["item_id"].isin(catalog)]
    item_idx = pd.Index(catalog).get_indexer(inter["item_id"]).astype(np.int64)
    user_pos = order.get_indexer(inter["user_id"]).astype(np.int64)
    keep = _latest_per_pair(inter, user_pos, item_idx, max(len(catalog), 1))
    ts = inter["timestamp"].to_numpy(np.int64)
    rows = np.flatnonzero(keep)
    rows = rows[np.lexsort((rows, ts[rows], user_pos[rows]))]
    bounds = np.searchsorted(user_pos[rows], np.arange(len(order) + 1))
    table["history"] = [item_idx[rows[a:b]] for a, b in itertools.pairwise(bounds)]
    return table


def _encoded_items(ds: Dataset, kept: pd.DataFrame) -> pd.DataFrame:
    """Items-table rows of surviving items, in items-table order (row i == item_idx i)."""
    surviving = pd.unique(kept["item_id"])
    known = ds.items["item_id"].isin(surviving)
    if known.sum() != len(surviving):
        missing = sorted(set(surviving) - set(ds.items["item_id"]))
        raise DataError(
            f"make_split: {len(missing)} interacted item id(s) missing from the items table of "
            f"{ds.name!r}, e.g. {missing[:5]}"
        )
    return ds.items.loc[known].reset_index(drop=True)


def _encoded_users(ds: Dataset, kept: pd.DataFrame) -> pd.DataFrame:
    """Users-table rows of surviving users, then unknown users with empty attributes."""
    table = ds.users
    if table["user_id"].duplicated().any():
        dup = table.loc[table["user_id"].duplicated(), "user_id"].iloc[0]
        raise DataError(f"make_split: duplicate user_id {dup!r} in the users table of {ds.name!r}")
    surviving = pd.unique(kept["user_id"])
    listed = table.loc[table["user_id"].isin(surviving), "user_id"]
    listed_set = set(listed)
    unlisted = [u for u in surviving if u not in listed_set]
    order = pd.Index(list(listed) + unlisted, name="user_id")
    reindexed = table.set_index("user_id").reindex(order).reset_index()
    return normalise_users(reindexed)  # fills the unknown users' rows with canonical empties


# one random stream per purpose, so e.g. fusion is not tuned on exactly the users recall early-stopped on
SALT_EARLY_STOP, SALT_TEST_REPORT, SALT_COARSE_TRAIN, SALT_COARSE_VALID, SALT_FUSION, SALT_SCALING_EVAL = range(1, 7)
SALT_FUSION_GATE, SALT_CHANNEL_GATE = 0x6A7E, 0x6A7F  # the gates' folds (fusion's value predates the names)
GATE_MIN_USERS = 20  # a gate keeps its incumbent below twice this many users rather than test a challenger
GATE_FOLDS = 5  # a gate's folds: each fold's users judge the choice made on the other folds


def gate_folds(n: int, seed: int, *, salt: int) -> np.ndarray:
    """The fold (0 .. ``GATE_FOLDS`` - 1) of each of ``n`` users of a gate, as even as ``n`` allows, seeded.

    >>> np.bincount(gate_folds(12, 0, salt=SALT_CHANNEL_GATE)).tolist()
    [3, 3, 2, 2, 2]
    """
    return np.random.default_rng([seed, salt]).permutation(n) % GATE_FOLDS


def out_of_fold(per_user: np.ndarray, best_on: Callable[[np.ndarray], int], folds: np.ndarray
                ) -> tuple[list[int], np.ndarray]:
    """How a gate's choice fares on users who took no part in it: ``per_user[option, user]`` holds
    each option's value for each user and ``best_on(users)`` the option chosen on those users. Each
    fold's users are judged under the option ``best_on`` the other folds' users; returns each fold's
    choice and every user's value under the choice made without them. Pooled over every user, this
    tests the choosing procedure (a grid search, a pick of the best stage) on as many users as there
    are, where one held-out half tests it on half of them; no user judges a choice it helped make.

    >>> values = np.array([[0.0, 0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0, 1.0]])
    >>> out_of_fold(values, lambda users: int(values[:, users].mean(axis=1).argmax()), np.arange(5))
    ([1, 1, 1, 1, 1], array([1., 1., 1., 1., 1.]))
    """
    chosen = [best_on(np.flatnonzero(folds != f)) for f in range(GATE_FOLDS)]
    return chosen, per_user[np.asarray(chosen)[folds], np.arange(per_user.shape[1])]


def gate_verdict(incumbent: np.ndarray, challenger: np.ndarray, seed: int) -> dict[str, Any]:
    """The gates' rule on out-of-fold values (``out_of_fold``): ``offline.bootstrap.paired_bootstrap`` of challenger minus
    incumbent per user (2000 draws) and ``wins``, true when its 95% CI lies above zero.

    >>> gate_verdict(np.zeros(4), np.ones(4), 0)["wins"], gate_verdict(np.ones(4), np.ones(4), 0)["wins"]
    (True, False)
    """
    boot = paired_bootstrap(incumbent, challenger, n_boot=2000, seed=seed)
    return {**boot, "wins": boot["ci95"][0] > 0}


def user_sample(users: np.ndarray, cap: int | None, seed: int, *, salt: int) -> np.ndarray:
    """``users`` unchanged when ``cap`` is None or they are no more than ``cap``, else ``cap`` of them
    drawn without replacement from the stream ``(seed, salt)``, sorted. Training-time measurements
    (early stopping, channel-share and fusion tuning, the coarse ranker's query groups) read such a
    sample, so their cost stops growing with the user count once it passes ``cap``; below it they
    read every user, as before.

    >>> user_sample(np.arange(5), None, 0, salt=1).tolist(), user_sample(np.arange(5), 5, 0, salt=1).tolist()
    ([0, 1, 2, 3, 4], [0, 1, 2, 3, 4])
    >>> a, b = user_sample(np.arange(100), 10, 0, salt=1), user_sample(np.arange(100), 10, 0, salt=2)
    >>> len(a), bool(np.all(np.diff(a) > 0)), a.tolist() == b.tolist()
    (10, True, False)
    """
    users = np.asarray(users, dtype=np.int64)
    if cap is None or len(users) <= cap:
        return users
    if cap < 1:
        raise ValueError(f"user_sample: cap must be >= 1 or None, got {cap}")
    return np.sort(np.random.default_rng([seed, salt]).choice(users, size=cap, replace=False))
