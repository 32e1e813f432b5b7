"""Item-to-item neighbour models fitted from interaction sequences, and the channel that serves them.

The recall stage serves them as its non-neural channels (``recall.extra_channels``), the coarse
ranker fits its own as features (``coarse_rank.channel_features``) and the evaluation compares
them as baselines; they live in the data layer so that no stage imports another for them.

Each model is one sparse ``[n_items, n_items]`` matrix ``W`` (row a = the items a points to,
with a weight); a user's score for item b is ``sum_a w_a * W[a, b]`` over (some of) their
history items a. Three builders:

- ``covisitation``: how often b was visited within ``window`` steps of a in the same user's
  time-ordered sequence, each pair weighted ``1 / distance`` (position decay) and
  ``backward`` when b came *before* a. The production "co-visitation matrix" of session
  recommenders (Ludewig & Jannach 2018, session-kNN; the OTTO/RecSys-challenge candidates).
  Built in chunks of users, so memory stays bounded at millions of interactions.
- ``item_knn``: cosine similarity of item columns of the binary user x item matrix with a
  shrink term (Sarwar et al. 2001), computed in row blocks and cut to the top ``top_k``
  neighbours per item, so memory is ``n_items * top_k`` entries, never ``n_items ** 2``:
  100K items x 200 neighbours = 20M entries (~160 MB as float32 + int32 CSR).
- ``ease``: the closed-form EASE^R item model (Steck 2019, "Embarrassingly shallow
  autoencoders"): ``P = (X'X + l2 I)^-1``, ``B = -P / diag(P)``, ``diag(B) = 0``. It needs a
  dense ``n x n`` inverse (float32: 4 n^2 bytes, twice during inversion), so
  ``item_model`` falls back to ``item_knn`` above ``max_dense`` items (default 10,000:
  ~0.8 GB peak); its rows are cut to the top ``top_k`` weights like the kNN's.

``NeighbourChannel`` serves any such ``W`` from the user's last ``last_n`` items with
recency-decayed weights ``1 / (1 + k)`` for the k-th most recent (``last_n=None``: the whole
history, weight 1 each, EASE's plain ``x_u B``). Measured on ML-100K valid (recall@200 /
NDCG@10 of the channel alone): co-visitation window 10, last 10 items: 0.802 / 0.115;
EASE l2=500 from the whole history 0.737 / 0.074, from the decayed last 50 items 0.791 /
0.119; item-kNN (shrink 10, whole history) 0.630 / 0.067; the two-tower (seed 42) 0.818 / 0.103.

Deliberately left out: time-decayed pair weights (timestamps are not in the training
sequences; position decay stands in), and re-fitting at serving time.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence

import numpy as np
from scipy import sparse

BLOCK_CELLS = 1 << 24  # dense cells per kNN block: 64 MB of float32 whatever the catalog size
PAIR_CHUNK = 1 << 22  # co-visitation pair entries built at once: ~100 MB of coo arrays
MAX_ENTRIES = 1 << 24  # co-visitation running total above which rows are pruned (~200 MB as CSR)
PRUNE_FACTOR = 2  # rows pruned to this many times top_k while accumulating


def _flatten(sequences: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(owner row, item) arrays of the concatenated sequences, in sequence order."""
    lengths = np.array([len(s) for s in sequences], dtype=np.int64)
    owner = np.repeat(np.arange(len(sequences), dtype=np.int64), lengths)
    items = np.concatenate([np.asarray(s, dtype=np.int64) for s in sequences]) if len(sequences) else owner
    return owner, items


def top_k_rows(mat: sparse.csr_matrix | np.ndarray, top_k: int) -> sparse.csr_matrix:
    """Keep the ``top_k`` largest entries of each row (ties to the lower column), as float32 CSR.

    >>> top_k_rows(np.array([[0., 3., 1., 3.], [2., 0., 0., 0.]]), 2).toarray().tolist()
    [[0.0, 3.0, 0.0, 3.0], [2.0, 0.0, 0.0, 0.0]]
    """
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    csr = sparse.csr_matrix(mat, dtype=np.float32)
    csr.eliminate_zeros()
    rows, cols, vals = [], [], []
    for r in range(csr.shape[0]):
        lo, hi = csr.indptr[r], csr.indptr[r + 1]
        c, v = csr.indices[lo:hi], csr.data[lo:hi]
        keep = np.lexsort((c, -v))[:top_k]
        rows.append(np.full(len(keep), r, dtype=np.int64))
        cols.append(c[keep])
        vals.append(v[keep])
    out = sparse.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                            shape=csr.shape, dtype=np.float32) if rows else sparse.csr_matrix(csr.shape, dtype=np.float32)
    out.sort_indices()
    return out


def covisitation(
    sequences: Sequence[np.ndarray], n_items: int, *, window: int = 3, backward: float = 0.5, top_k: int = 200,
    chunk_pairs: int = PAIR_CHUNK, max_entries: int = MAX_ENTRIES,
) -> sparse.csr_matrix:
    """W[a, b] = sum over pairs (a at i, b at j) of one sequence, 1 <= |i - j| <= window, a != b,
    of ``1 / |i - j|``, times ``backward`` when j < i; each row cut to its ``top_k`` entries.

    Memory does not grow with the number of interactions: users are taken in chunks of about
    ``chunk_pairs`` pair entries (``2 * window`` per interaction), each chunk's pairs summed
    into a sparse CSR (coo -> csr adds duplicates) and added to the running float64 total.
    Whenever ``max_entries`` more entries have come in since the last cut, the total's rows are
    cut to their ``PRUNE_FACTOR * top_k`` largest; until the first cut the result is exact (the
    chunking changes no value, nor any tie, thanks to float64), after it a pair whose weight
    builds up only late may be lost from a row it would have entered at rank ~top_k. Peak:
    one chunk (~24 bytes a pair, ~100 MB) plus twice the total (12 bytes an entry), the total
    holding at most ``n_items * PRUNE_FACTOR * top_k + max_entries`` entries. Measured (window
    10, synthetic Zipf sequences, process peak RSS): 1M interactions / 12.5K items 374 MB
    (all pairs at once: 887 MB), 5M / 62.5K items 1.6 GB in 25 s (all pairs at once: 4.2 GB).

    >>> covisitation([np.array([0, 1, 2])], 3, window=2, backward=0.5).toarray().tolist()
    [[0.0, 1.0, 0.5], [0.5, 0.0, 1.0], [0.25, 0.5, 0.0]]
    >>> seqs = [np.array([0, 1, 2]), np.array([2, 1]), np.array([1, 0, 2])]
    >>> bool((covisitation(seqs, 3, chunk_pairs=1).toarray() == covisitation(seqs, 3).toarray()).all())
    True
    """
    if window < 1:
        raise ValueError(f"covisitation: window must be >= 1, got {window}")
    if chunk_pairs < 1 or max_entries < 1:
        raise ValueError(f"covisitation: chunk_pairs and max_entries must be >= 1, got {chunk_pairs}, {max_entries}")
    cuts = pair_chunks(sequences, window, chunk_pairs)
    parts = (covisit_pairs(sequences[lo:hi], n_items, window, backward) for lo, hi in itertools.pairwise(cuts))
    return merge_pair_counts(parts, n_items, top_k=top_k, max_entries=max_entries)


def pair_chunks(sequences: Sequence[np.ndarray], window: int, chunk_pairs: int) -> list[int]:
    """Cut points cutting the users into consecutive runs of about ``chunk_pairs`` pair entries each.

    >>> pair_chunks([np.arange(3), np.arange(3), np.arange(5)], 1, 10)
    [0, 1, 2, 3]
    """
    chunk_of = np.cumsum([2 * window * len(s) for s in sequences], dtype=np.int64) // chunk_pairs
    return [0, *(np.flatnonzero(np.diff(chunk_of)) + 1).tolist(), len(sequences)]


def merge_pair_counts(parts: Iterable[sparse.csr_matrix], n_items: int, *, top_k: int, max_entries: int
                      ) -> sparse.csr_matrix:
    """The co-visitation weights from per-chunk pair sums (``covisit_pairs``), added in the order given.

    The running total is float64 (chunking does not flip ties); whenever ``max_entries`` more
    entries have come in since the last cut its rows are cut to ``PRUNE_FACTOR * top_k`` (see
    ``covisitation``). Shared by ``covisitation`` and ``offline.distributed_counts``, whose
    chunks are partitions of users counted on a cluster.
    """
    total = sparse.csr_matrix((n_items, n_items), dtype=np.float64)
    limit = max_entries
    for part in parts:
        total = total + part
        if total.nnz > limit:
            total = top_k_rows(total, PRUNE_FACTOR * top_k)
            limit = total.nnz + max_entries  # prune again once max_entries more have come in, not every chunk
    return top_k_rows(total, top_k)


def covisit_pairs(sequences: Sequence[np.ndarray], n_items: int, window: int, backward: float
                   ) -> sparse.csr_matrix:
    """The summed co-visitation pairs of ``sequences`` alone (see ``covisitation``), float64 CSR."""
    owner, items = _flatten(sequences)
    rows, cols, vals = [], [], []
    for d in range(1, window + 1):  # one vectorised pass per distance
        same = (owner[d:] == owner[:-d]) & (items[d:] != items[:-d])
        a, b = items[:-d][same], items[d:][same]
        rows += [a, b]
        cols += [b, a]
        vals += [np.full(len(a), 1.0 / d), np.full(len(a), backward / d)]
    mat = sparse.coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                            shape=(n_items, n_items)).tocsr()
    mat.sum_duplicates()
    return mat


def item_counts(sequences: Sequence[np.ndarray], n_items: int) -> np.ndarray:
    """Events per item over ``sequences`` (repeats count each time): the popularity of what a model learnt from.

    >>> item_counts([np.array([0, 2, 2]), np.array([], dtype=np.int64)], 4).tolist()
    [1, 0, 2, 0]
    """
    return np.bincount(_flatten(sequences)[1], minlength=n_items)


def user_item_matrix(sequences: Sequence[np.ndarray], n_items: int) -> sparse.csr_matrix:
    """Binary ``[n_users, n_items]`` CSR (repeats count once)."""
    owner, items = _flatten(sequences)
    x = sparse.csr_matrix((np.ones(len(items), np.float32), (owner, items)), shape=(len(sequences), n_items))
    x.data[:] = 1.0
    return x


def item_knn(sequences: Sequence[np.ndarray], n_items: int, *, top_k: int = 200, shrink: float = 10.0
             ) -> sparse.csr_matrix:
    """Top-``top_k`` cosine neighbours per item: ``|U_a & U_b| / (sqrt(|U_a| |U_b|) + shrink)``.

    >>> (1000 * item_knn([np.array([0, 1]), np.array([0, 1, 2])], 3, shrink=0.0).toarray()).round().tolist()
    [[0.0, 1000.0, 707.0], [1000.0, 0.0, 707.0], [707.0, 707.0, 0.0]]
    """
    x = user_item_matrix(sequences, n_items)
    xt = x.T.tocsr()
    return knn_weights(lambda start, stop: (xt[start:stop] @ x).toarray(), np.asarray(x.sum(axis=0)).ravel(),
                       n_items, top_k=top_k, shrink=shrink)


def knn_weights(gram_rows: Callable[[int, int], np.ndarray], counts: np.ndarray, n_items: int, *, top_k: int,
                shrink: float) -> sparse.csr_matrix:
    """``item_knn``'s weights from co-occurrence counts: ``gram_rows(start, stop)`` gives rows
    ``start:stop`` of ``X'X`` as a dense float32 block, ``counts`` its diagonal (users per item).

    Shared by ``item_knn`` (blocks of ``X'X`` computed from the user x item matrix) and
    ``offline.distributed_counts`` (blocks of a ``X'X`` summed from per-partition counts): the
    counts are exact integers either way, so both give the same weights bit for bit.
    """
    norms = np.sqrt(counts)
    block = max(1, BLOCK_CELLS // max(n_items, 1))
    parts = []
    for start in range(0, n_items, block):
        stop = min(start + block, n_items)
        sim = gram_rows(start, stop)
        sim /= norms[start:stop, None] * norms[None, :] + shrink + 1e-12
        sim[np.arange(stop - start), np.arange(start, stop)] = 0.0
        parts.append(_dense_top_k(sim, top_k))
    return sparse.vstack(parts, format="csr") if parts else sparse.csr_matrix((0, n_items), dtype=np.float32)


def ease(sequences: Sequence[np.ndarray], n_items: int, *, l2: float = 500.0, top_k: int = 200
         ) -> sparse.csr_matrix:
    """EASE^R weights (see module doc), each row cut to its ``top_k`` largest weights.

    Memory: the Gram matrix and its inverse are dense ``n_items x n_items`` float32 (4 n^2 bytes
    each, ~0.8 GB peak at 10,000 items, 40 GB at 100,000), so ``item_model`` fits EASE only up to
    ``max_dense`` items (``RecallConfig.ease_max_items``) and the sparse, block-wise ``item_knn``
    beyond: at 100K items x 200 neighbours that is ~160 MB of CSR, with one 64 MB dense block
    (``BLOCK_CELLS``) at a time while it is computed. What is kept is the same either way:
    ``top_k`` weights per row.
    """
    x = user_item_matrix(sequences, n_items)
    return ease_weights((x.T @ x).toarray().astype(np.float32), l2=l2, top_k=top_k)


def ease_weights(gram: np.ndarray, *, l2: float, top_k: int) -> sparse.csr_matrix:
    """EASE^R weights from the dense float32 co-occurrence counts ``X'X`` (changed in place).

    Shared by ``ease`` and ``offline.distributed_counts``, whose ``X'X`` is summed from
    per-partition counts: exact integers either way, so both give the same weights.
    """
    n_items = gram.shape[0]
    gram[np.diag_indices(n_items)] += l2
    p = np.linalg.inv(gram)
    del gram
    b = p / -np.diag(p)[None, :]
    b[np.diag_indices(n_items)] = 0.0
    return _dense_top_k(b, top_k)


def item_model(sequences: Sequence[np.ndarray], n_items: int, *, kind: str, top_k: int, l2: float,
               shrink: float, max_dense: int) -> tuple[str, sparse.csr_matrix]:
    """(the kind actually fitted, W): ``ease`` up to ``max_dense`` items, ``knn`` beyond or when asked."""
    if kind not in ("ease", "knn"):
        raise ValueError(f"item model kind must be 'ease' or 'knn', got {kind!r}")
    if kind == "ease" and n_items <= max_dense:
        return "ease", ease(sequences, n_items, l2=l2, top_k=top_k)
    return "knn", item_knn(sequences, n_items, top_k=top_k, shrink=shrink)


def _dense_top_k(block: np.ndarray, top_k: int) -> sparse.csr_matrix:
    """Rows of a dense block cut to their ``top_k`` largest positive entries (argpartition, no full sort)."""
    n_rows, n_cols = block.shape
    k = min(top_k, n_cols)
    idx = np.argpartition(-block, k - 1, axis=1)[:, :k] if k < n_cols else np.tile(np.arange(n_cols), (n_rows, 1))
    vals = np.take_along_axis(block, idx, axis=1)
    keep = vals > 0
    rows = np.repeat(np.arange(n_rows), keep.sum(axis=1))
    out = sparse.csr_matrix((vals[keep].astype(np.float32), (rows, idx[keep])), shape=(n_rows, n_cols))
    out.sort_indices()
    return out


def row_entries(mat: sparse.csr_matrix, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The stored entries of ``mat[rows]`` as flat arrays (position in ``rows``, column, value), row by row
    in ``rows`` order: a row look-up without scipy's per-call set-up, which costs more than the
    look-up itself at serving sizes (a few rows of a few hundred entries).

    >>> m = sparse.csr_matrix(np.array([[0, 5, 0], [0, 0, 0], [7, 0, 8]], np.float32))
    >>> [a.tolist() for a in row_entries(m, np.array([2, 0, 2]))]
    [[0, 0, 1, 2, 2], [0, 2, 1, 0, 2], [7.0, 8.0, 5.0, 7.0, 8.0]]
    """
    rows = np.asarray(rows, dtype=np.int64)
    starts = mat.indptr[rows]
    lens = mat.indptr[rows + 1] - starts
    at = np.repeat(starts - (np.cumsum(lens) - lens), lens) + np.arange(int(lens.sum()))
    return np.repeat(np.arange(len(rows)), lens), mat.indices[at].astype(np.int64), mat.data[at]


class NeighbourChannel:
    """A recall channel over an item-to-item matrix ``W`` (see module doc).

    ``last_n=None`` reads the whole history with weight 1 per distinct item; an int reads
    the last ``last_n`` items, the k-th most recent (k = 0, 1, ...) with weight ``1 / (1 + k)``.
    """

    def __init__(self, name: str, weights: sparse.csr_matrix, last_n: int | None) -> None:
        if weights.shape[0] != weights.shape[1]:
            raise ValueError(f"channel {name!r}: weights must be square, got {weights.shape}")
        if last_n is not None and last_n < 1:
            raise ValueError(f"channel {name!r}: last_n must be >= 1 or None, got {last_n}")
        self.name, self.weights, self.last_n = name, sparse.csr_matrix(weights, dtype=np.float32), last_n

    @property
    def n_items(self) -> int:
        return self.weights.shape[0]

    def query(self, history: np.ndarray) -> sparse.csr_matrix:
        """The ``[1, n_items]`` query row for ``history`` (time order, oldest first)."""
        items, w = self.query_items(history)
        return sparse.csr_matrix((w, (np.zeros(len(items), np.int64), items)), shape=(1, self.n_items))

    def query_items(self, history: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``query``'s non-zero entries: (item indices ascending, float32 weights)."""
        h = np.asarray(history, dtype=np.int64)
        h = h[(h >= 0) & (h < self.n_items)]
        if self.last_n is None:
            items = np.unique(h)
            return items, np.ones(len(items), np.float32)
        recent = h[::-1][: self.last_n]
        items, first = np.unique(recent, return_index=True)  # an item seen twice counts at its latest
        return items, (1.0 / (1.0 + first)).astype(np.float32)

    def scores(self, history: np.ndarray) -> np.ndarray:
        """Dense float32 scores of every item for ``history`` (0 where no history item points to it).

        ``query(history) @ weights`` without building sparse matrices per request (their set-up costs
        more than the product at serving sizes): the query items' rows, each scaled by its weight,
        summed into the dense row in query order, in float32 as scipy's product sums them, so the
        scores are bit-for-bit those of the sparse product.
        """
        items, w = self.query_items(history)
        which, cols, vals = row_entries(self.weights, items)
        out = np.zeros(self.n_items, np.float32)
        np.add.at(out, cols, vals * w[which])
        return out

    def candidates(self, history: np.ndarray, exclude: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Up to ``n`` items with a positive score, best first (ties to the lower index), none excluded."""
        s = self.scores(history)
        ex = np.asarray(exclude, dtype=np.int64)
        s[ex[(ex >= 0) & (ex < self.n_items)]] = 0.0
        pos = np.flatnonzero(s > 0)
        if len(pos) > n:
            pos = pos[np.argpartition(-s[pos], n - 1)[:n]]
        order = pos[np.lexsort((pos, -s[pos]))]
        return order.astype(np.int64), s[order]
