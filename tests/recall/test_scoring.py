"""Full-ranking evaluation of the two-tower (recall.scoring): the trainer's metrics and user vectors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from offline.metrics import candidate_recall, per_user_metrics, rank_full, summarize
from recall.scoring import FrozenUserEncoder, full_ranking_metrics, user_vectors
from recall.towers import UserTower


def _from_top_lists(users, items, histories, targets) -> dict[str, float]:
    """The same figures read off ``rank_full``'s top-200 lists: what the target ranks must reproduce."""
    keep = np.flatnonzero(targets >= 0)
    top = rank_full(users[keep] @ items.T, [histories[u] for u in keep], min(200, len(items)))
    out = summarize(per_user_metrics(top, targets[keep], k=10))
    out.update({f"recall@{k}": candidate_recall(top[:, :k], targets[keep]) for k in (50, 200)})
    return {name: round(v, 5) for name, v in out.items() if not name.startswith("mrr")}


@pytest.mark.parametrize("n_items", [30, 150, 1000])
@pytest.mark.parametrize("ties", [False, True])
def test_metrics_from_target_ranks_equal_those_of_the_top_lists(n_items: int, ties: bool):
    # ties (coarse scores) must go to the lower item index, excluded history items never rank, a target
    # in the history is never found, users without a target (-1) are skipped
    rng = np.random.default_rng(n_items)
    users, items = rng.normal(size=(400, 8)).astype(np.float32), rng.normal(size=(n_items, 8)).astype(np.float32)
    if ties:
        users, items = np.round(users * 4) / 4, np.round(items)
    histories = [rng.choice(n_items, rng.integers(0, 20), replace=False) for _ in range(400)]
    targets = rng.integers(-1, n_items, 400)
    targets[:5] = [h[0] if len(h) else -1 for h in histories[:5]]
    assert full_ranking_metrics(users, items, histories, targets) == _from_top_lists(users, items, histories, targets)


def test_user_vectors_by_length_equal_the_padded_ones():
    torch.manual_seed(0)
    tower = UserTower(16, 12, 2, 2, 0.1, (3, 3, 3)).eval()
    items = torch.nn.functional.normalize(torch.randn(40, 16), dim=-1)
    rng = np.random.default_rng(0)
    histories = [rng.integers(0, 40, rng.integers(0, 30)) for _ in range(50)]
    attrs = rng.integers(0, 3, (50, 3))
    padded = user_vectors(tower, items, histories, attrs, batch_size=8)
    by_length = user_vectors(tower, items, histories, attrs, batch_size=8, by_length=True)
    np.testing.assert_allclose(by_length, padded, atol=1e-5)


def test_the_frozen_encoder_equals_user_vectors_bit_for_bit():
    torch.manual_seed(1)
    tower = UserTower(16, 12, 2, 2, 0.1, (3, 3, 3)).eval()
    items = torch.nn.functional.normalize(torch.randn(40, 16), dim=-1).numpy()
    rng = np.random.default_rng(1)
    encoder = FrozenUserEncoder(tower, items)
    for length in (0, 1, 5, 11, 12, 30):  # empty, short, exactly max_len - 1 and max_len, longer than the tower reads
        history, codes = rng.integers(0, 40, length), rng.integers(0, 3, 3)
        one = encoder(history, codes)
        assert one.shape == (1, 16) and one.dtype == np.float32
        np.testing.assert_array_equal(one, user_vectors(tower, items, [history], codes[None]))
