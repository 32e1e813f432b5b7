"""Co-visitation and item-model counts over a Ray cluster: per-partition counts of users, merged.

The single-process builders of ``offline.item_neighbours`` read every user's sequence in one
process. Here the users are cut into partitions of consecutive users (a user is never split,
so no co-visitation pair crosses a partition), each partition is counted by a Ray Data task
(``map_batches``: one block, one call) and the partial counts are merged on the driver:

- ``covisitation``: each partition's summed pair weights (``item_neighbours.covisit_pairs``),
  merged in partition order by ``item_neighbours.merge_pair_counts`` (the single-process
  builder's own merge, pruning included);
- ``item_model``: each partition's co-occurrence counts ``X_p' X_p`` (binary user x item rows),
  whose sum is ``X'X``: exact integers, turned into EASE^R or item-kNN weights by the same
  ``ease_weights`` / ``knn_weights`` as the single-process builders.

So the weights equal the single-process ones bit for bit (``tests/offline/test_distributed_counts.py``)
whenever the single-process build cuts no row while accumulating (below ``MAX_ENTRIES`` pair
entries in total); past that both cut rows, at different moments, and may keep different
entries near rank ``top_k``.

A Ray instance must be running (``ray.init`` or ``recsys.cluster.ray_session``); the driver
holds one partial count at a time plus the running total. Deliberately left out: a reduce on the
cluster (the merged total has to reach the driver to be saved anyway) and the item-kNN's
block-wise product on workers.
"""

from __future__ import annotations

import itertools
import pickle
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy import sparse

from offline.item_neighbours import (
    MAX_ENTRIES,
    PAIR_CHUNK,
    covisit_pairs,
    ease_weights,
    knn_weights,
    merge_pair_counts,
    pair_chunks,
    user_item_matrix,
)


def user_partitions(sequences: Sequence[np.ndarray], cuts: Sequence[int]) -> list[pd.DataFrame]:
    """One frame per run ``cuts[i]:cuts[i + 1]`` of consecutive users: column ``items`` (the sequences)."""
    return [pd.DataFrame({"items": [np.asarray(s, dtype=np.int64) for s in sequences[lo:hi]]})
            for lo, hi in itertools.pairwise(cuts) if hi > lo]


def even_cuts(n_users: int, partitions: int) -> list[int]:
    """Cut points of ``partitions`` runs of users of (nearly) equal size.

    >>> even_cuts(10, 3)
    [0, 4, 7, 10]
    """
    sizes = np.full(partitions, n_users // partitions) + (np.arange(partitions) < n_users % partitions)
    return [0, *np.cumsum(sizes).tolist()]


def _counted(frames: list[pd.DataFrame], count: Any) -> Iterator[sparse.csr_matrix]:
    """Each frame's counts, ``count(sequences) -> csr``, computed by Ray Data tasks, in frame order."""
    import ray  # lazy: heavy optional dependency, only when a cluster builds the counts

    def task(batch: pd.DataFrame) -> dict[str, np.ndarray]:
        mat = count([np.asarray(s, dtype=np.int64) for s in batch["items"]])
        return {"counts": np.array([pickle.dumps(mat)], dtype=object)}

    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True  # merge in partition order: the float sums round the same way
    ds = ray.data.from_pandas(frames).map_batches(task, batch_format="pandas", batch_size=None)
    for row in ds.iter_rows():
        yield pickle.loads(row["counts"])


def covisitation(sequences: Sequence[np.ndarray], n_items: int, *, window: int = 3, backward: float = 0.5,
                 top_k: int = 200, chunk_pairs: int = PAIR_CHUNK, max_entries: int = MAX_ENTRIES,
                 min_partitions: int = 2) -> sparse.csr_matrix:
    """``item_neighbours.covisitation`` counted on the cluster: partitions of about ``chunk_pairs``
    pair entries (at least ``min_partitions``, so every worker has one), merged in order."""
    if window < 1:
        raise ValueError(f"covisitation: window must be >= 1, got {window}")
    if chunk_pairs < 1 or max_entries < 1 or min_partitions < 1:
        raise ValueError(f"covisitation: chunk_pairs, max_entries and min_partitions must be >= 1, "
                         f"got {chunk_pairs}, {max_entries}, {min_partitions}")
    cuts = pair_chunks(sequences, window, chunk_pairs)
    if len(cuts) - 1 < min_partitions:
        cuts = even_cuts(len(sequences), min(min_partitions, max(len(sequences), 1)))

    def count(seqs: list[np.ndarray]) -> sparse.csr_matrix:
        return covisit_pairs(seqs, n_items, window, backward)

    return merge_pair_counts(_counted(user_partitions(sequences, cuts), count), n_items, top_k=top_k,
                             max_entries=max_entries)


def cooccurrence(sequences: Sequence[np.ndarray], n_items: int, *, partitions: int = 2) -> sparse.csr_matrix:
    """``X'X`` of the binary user x item matrix, summed from ``partitions`` partitions' counts (float32 CSR:
    exact integers below 2**24 users per pair)."""
    if partitions < 1:
        raise ValueError(f"cooccurrence: partitions must be >= 1, got {partitions}")

    def count(seqs: list[np.ndarray]) -> sparse.csr_matrix:
        x = user_item_matrix(seqs, n_items)
        return (x.T @ x).tocsr()

    total = sparse.csr_matrix((n_items, n_items), dtype=np.float32)
    frames = user_partitions(sequences, even_cuts(len(sequences), min(partitions, max(len(sequences), 1))))
    for part in _counted(frames, count):
        total = total + part
    return total


def item_model(sequences: Sequence[np.ndarray], n_items: int, *, kind: str, top_k: int, l2: float,
               shrink: float, max_dense: int, partitions: int = 2) -> tuple[str, sparse.csr_matrix]:
    """``item_neighbours.item_model`` from cluster-summed co-occurrence counts: (kind fitted, W)."""
    if kind not in ("ease", "knn"):
        raise ValueError(f"item model kind must be 'ease' or 'knn', got {kind!r}")
    gram = cooccurrence(sequences, n_items, partitions=partitions)
    if kind == "ease" and n_items <= max_dense:
        return "ease", ease_weights(gram.toarray().astype(np.float32), l2=l2, top_k=top_k)
    return "knn", knn_weights(lambda start, stop: gram[start:stop].toarray(), gram.diagonal(), n_items,
                              top_k=top_k, shrink=shrink)
