"""Item embeddings from the LLM: a small MLP over cached pooled hidden states, trained by InfoNCE.

Input: ``tags/hidden.npy`` (the tagging job's mean-pooled last hidden states, computed once).
The MLP (standardise -> Linear -> GELU -> Linear -> L2-normalise) maps them to ``dim`` (256)
and is trained contrastively: positives are items consecutive in users' *training* sequences
(so validation/test interactions never leak in), negatives are the other items of the batch
(in-batch softmax, InfoNCE as in CLIP / SimCLR, symmetric), temperature ``tau``. The
projection is what is served; raw hidden states are never an output.

Writes ``tags/embed/``: ``embeddings.npy`` (n x dim, unit rows, row i = item_idx i),
``mlp.pt``, ``meta.json`` (tags version + settings + loss curve) and a faiss index
(``recall.index.ItemIndex``) in ``tags/embed/index/``, as one set (``jobs.tagging.staging``:
built beside ``embed/`` and swapped in, so a failed run leaves the previous set whole). The
tags must be the split's own items in order (``jobs.tagging.catalog.require_same_items``).

Deliberately left out: fine-tuning the LLM itself; hard-negative mining.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from coarse_rank.llm_features import ItemEmbeddings
from jobs.tagging.catalog import catalog_digest, require_same_items
from jobs.tagging.staging import staged_dir
from llm_rerank.training_loop import epoch_means, run_steps
from offline.tag_store import load_tags
from recall.index import ItemIndex
from recsys.atomic import atomic_write_json


@dataclass(frozen=True)
class EmbedSettings:
    dim: int = 256
    hidden: int = 512
    epochs: int = 30
    batch_size: int = 512
    lr: float = 2e-3
    tau: float = 0.1
    seed: int = 0


def cooccurrence_pairs(train_sequences: list[np.ndarray]) -> np.ndarray:
    """(m, 2) item pairs consecutive in the training sequences, self-pairs dropped.

    >>> cooccurrence_pairs([np.array([3, 1, 1, 2]), np.array([5])]).tolist()
    [[3, 1], [1, 2]]
    """
    pairs = [np.stack([s[:-1], s[1:]], axis=1) for s in train_sequences if len(s) >= 2]
    if not pairs:
        raise ValueError("no user has two training interactions: nothing to train embeddings on")
    out = np.concatenate(pairs).astype(np.int64)
    return out[out[:, 0] != out[:, 1]]


def build_mlp(in_dim: int, settings: EmbedSettings, mean: np.ndarray, std: np.ndarray) -> Any:
    import torch  # lazy: heavy (torch)
    from torch import nn  # lazy: heavy (torch)

    class Projection(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("mean", torch.as_tensor(mean, dtype=torch.float32))
            self.register_buffer("std", torch.as_tensor(std, dtype=torch.float32))
            self.net = nn.Sequential(nn.Linear(in_dim, settings.hidden), nn.GELU(),
                                     nn.Linear(settings.hidden, settings.dim))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            mean, std = self.get_buffer("mean"), self.get_buffer("std")
            return nn.functional.normalize(self.net((x - mean) / std), dim=-1)

    return Projection()


def train_projection(hidden: np.ndarray, pairs: np.ndarray, settings: EmbedSettings) -> tuple[Any, list[float]]:
    """Fit the MLP by symmetric in-batch InfoNCE on ``pairs``; (model, mean loss per epoch)."""
    import torch  # lazy: heavy (torch)

    torch.manual_seed(settings.seed)
    rng = np.random.default_rng(settings.seed)
    x = torch.as_tensor(hidden, dtype=torch.float32)
    mean, std = hidden.mean(0), hidden.std(0) + 1e-6
    model = build_mlp(hidden.shape[1], settings, mean, std)
    optim = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=1e-4)
    steps = [order[start : start + settings.batch_size] for order in
             (rng.permutation(len(pairs)) for _ in range(settings.epochs))
             for start in range(0, len(order), settings.batch_size)]
    losses = run_steps(optim, steps, lambda _, step: _info_nce(model, x, pairs[step], settings.tau),
                       desc="tag embed", progress=False)
    curve = epoch_means(losses, len(steps) // settings.epochs)
    return model.eval(), curve


def _info_nce(model: Any, x: Any, batch: np.ndarray, tau: float) -> Any:
    """Symmetric in-batch InfoNCE of the pairs ``batch`` (rows of item indices into ``x``)."""
    import torch  # lazy: heavy (torch)
    import torch.nn.functional as F  # lazy: heavy (torch)

    a, b = model(x[batch[:, 0]]), model(x[batch[:, 1]])
    logits = a @ b.T / tau
    # Repeated items inside a batch are false negatives; mask every off-diagonal duplicate.
    same = torch.as_tensor(batch[:, 1][None, :] == batch[:, 1][:, None]) & ~torch.eye(len(batch), dtype=torch.bool)
    logits = logits.masked_fill(same, float("-inf"))
    target = torch.arange(len(batch))
    return (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2


def project_hidden(hidden: np.ndarray, sequences: list[np.ndarray], settings: EmbedSettings
                   ) -> tuple[np.ndarray, dict[str, Any]]:
    """Unit ``[n_items, dim]`` embeddings of ``hidden`` by a projection trained on the item pairs
    consecutive in ``sequences`` only; (vectors, its report: pairs and loss per epoch).

    The coarse ranker's features call it with the training sequences cut before their labels
    (``jobs.train.holdout_sequences``), so no label's transition is in the embedding it learns from.
    """
    import torch  # lazy: heavy (torch)

    pairs = cooccurrence_pairs(sequences)
    model, curve = train_projection(hidden, pairs, settings)
    with torch.inference_mode():
        vectors = model(torch.as_tensor(hidden, dtype=torch.float32)).numpy().astype(np.float32)
    return vectors, {"pairs": len(pairs), "loss_per_epoch": curve}


def load_hidden(tags_dir: Path, item_ids: list[object]) -> np.ndarray:
    """The pooled hidden states ``tags_dir/hidden.npy``, checked to be those of the catalog ``item_ids``
    (in item_idx order) by the catalog digest ``version.json`` records; one-line errors naming the file."""
    path, version_path = Path(tags_dir) / "hidden.npy", Path(tags_dir) / "version.json"
    if not path.is_file() or not version_path.is_file():
        missing = path if not path.is_file() else version_path
        raise FileNotFoundError(f"{missing} missing: the LLM item embeddings need the items' pooled hidden states; "
                                "run `recsys tag --method embed` (or `recsys tag`) for this split")
    made_for = json.loads(version_path.read_text()).get("catalog")
    if made_for != catalog_digest(item_ids):
        raise ValueError(f"{version_path}: the hidden states were made for another catalog ({made_for}) than the "
                         f"split's ({catalog_digest(item_ids)}): rerun `recsys tag --method embed --fresh`")
    hidden = np.load(path)
    if hidden.ndim != 2 or len(hidden) != len(item_ids):
        raise ValueError(f"{path}: {hidden.shape} pooled states for {len(item_ids)} items: rerun `recsys tag`")
    return hidden


def coarse_item_embeddings(split: Any, tags_dir: Path, sequences: list[np.ndarray], settings: EmbedSettings
                           ) -> ItemEmbeddings:
    """The coarse ranker's ``ItemEmbeddings``: ``tags_dir``'s hidden states projected by ``project_hidden``
    trained on ``sequences`` (the training sequences without the coarse ranker's labels)."""
    hidden = load_hidden(tags_dir, split.items["item_id"].tolist())
    vectors, _ = project_hidden(hidden, sequences, settings)
    return ItemEmbeddings.from_vectors(vectors, split.n_items)


def train_embeddings(split: Any, tags_dir: Path, settings: EmbedSettings) -> dict[str, Any]:
    """Train on ``tags/hidden.npy`` + the split's train sequences; write ``tags/embed/``."""
    import torch  # lazy: heavy (torch)

    t0 = time.perf_counter()
    tags, hidden, version = load_tags(tags_dir)
    require_same_items(tags["item_id"].tolist(), split.items, str(Path(tags_dir) / "tags.parquet"))
    if len(hidden) != split.n_items:
        raise ValueError(f"{Path(tags_dir) / 'hidden.npy'}: {len(hidden)} pooled states for {split.n_items} items: "
                         "re-run `recsys tag`")
    pairs = cooccurrence_pairs(split.train_sequences)
    model, curve = train_projection(hidden, pairs, settings)
    with torch.inference_mode():
        vectors = model(torch.as_tensor(hidden, dtype=torch.float32)).numpy().astype(np.float32)
    with staged_dir(Path(tags_dir) / "embed") as out:
        np.save(out / "embeddings.npy", vectors, allow_pickle=False)
        torch.save(model.state_dict(), out / "mlp.pt")
        ItemIndex.build(vectors, "flat").save(out / "index")
        meta = {"tags_version": version, "settings": asdict(settings), "pairs": len(pairs), "loss_per_epoch": curve,
                "seconds": time.perf_counter() - t0, "n_items": len(vectors)}
        atomic_write_json(out / "meta.json", meta)
    return meta

