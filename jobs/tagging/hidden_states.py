"""Embedding-only mode of the tagging job: every item's pooled LLM hidden state, then the 256-d projection.

``embed_catalog`` runs one forward pass per batch of item texts through the backbone (no
generation, no grammar, no JSON decoding), mean-pools the last hidden layer over each text's
tokens (``jobs.tagging.generate.pooled_states``, as the tagger does) and then trains the
contrastive projection (``jobs.tagging.embed.train_embeddings``), so one run leaves
``tags/embed/embeddings.npy`` (n x 256, unit rows) and its faiss index: what the LLM-embedding
recall channel (``recall.llm_channel``) and the coarse LLM-embedding features
(``jobs.coarse_tags.load_llm_embeddings``) read.

It is the tagging job's own machinery (``jobs.tagging.job``): fixed chunks of item order, atomic
part files that carry the job version, a manifest, resuming after a kill, ``limit`` runs and
``fresh``. Its version says ``method: embed`` and digests the item texts it encoded (the
``llm.item_text`` rendering, ``llm_rerank.item_text.item_labels``), so parts of a tagging run, of
another text rendering or of another model are refused, never mixed. ``tags.parquet`` then holds
only ``item_idx`` and ``item_id`` (the rows ``hidden.npy`` belongs to); readers of tags refuse it
by name.

Deliberately left out: tags (``jobs.tagging.run``), the projection's training
(``jobs.tagging.embed``), Ray (a forward pass over 4,385 short texts takes minutes on 2 cores).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from jobs.tagging.catalog import catalog_digest
from jobs.tagging.embed import EmbedSettings, train_embeddings
from jobs.tagging.generate import pooled_states
from jobs.tagging.job import EMBED_METHOD, TagJob, finalize, plan, run_local, start
from jobs.tagging.model_dir import check_model_dir, load_or_refuse
from llm_rerank.backbone import load_model, weights_digest
from recsys.atomic import atomic_write_json
from recsys.digest import json_sha256


@dataclass(frozen=True)
class HiddenSettings:
    """What the pooled states depend on; part of the job version."""

    precision: str = "fp32"  # llm_rerank.backbone.resolve_precision
    max_tokens: int = 64  # tokens of an item's text the mean pools over (the tagger's embed_max_tokens)
    threads: int | None = None


def hidden_version(model_dir: str, texts: Sequence[str], settings: HiddenSettings, chunk_size: int,
                   batch_size: int, item_ids: Sequence[object]) -> dict[str, Any]:
    """Everything the pooled states depend on: the model, the texts, the settings, the chunking and the
    catalog (``item_ids`` in item_idx order)."""
    return {"method": EMBED_METHOD, "model_digest": weights_digest(model_dir),
            "item_text": json_sha256([str(t) for t in texts])[:16], "settings": asdict(settings),
            "chunk_size": chunk_size, "batch_size": batch_size, "catalog": catalog_digest(item_ids), "categories": []}


class HiddenEncoder:
    """Model + tokenizer + the catalog's item texts; ``embed_batch`` is the unit of work."""

    def __init__(self, model_dir: str, texts: Sequence[str], settings: HiddenSettings) -> None:
        self.model_dir, self.texts, self.settings = model_dir, list(texts), settings
        self.model: Any = None

    def load(self) -> HiddenEncoder:
        self.model, self.tok = load_model(self.model_dir, self.settings.precision, self.settings.threads)
        if self.tok.pad_token_id is None:
            self.tok.pad_token = self.tok.eos_token
        return self

    def embed_batch(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """One ``{"item_idx", "hidden"}`` per row (rows as ``jobs.tagging.job.TagJob.chunk_batches`` cuts them)."""
        texts = [self.texts[int(r["item_idx"])] for r in rows]
        pooled = pooled_states(self.model, self.tok, texts, self.settings.max_tokens)
        return [{"item_idx": int(r["item_idx"]), "hidden": h} for r, h in zip(rows, pooled, strict=True)]


def embed_catalog(split: Any, model_dir: str, artifact_dir: Path, texts: Sequence[str], settings: HiddenSettings,
                  *, embed: EmbedSettings | None = None, chunk_size: int = 64, batch_size: int = 32,
                  limit: int | None = None, fresh: bool = False, progress: bool = True) -> dict[str, Any]:
    """Pool the hidden states of ``texts`` (row i = item_idx i of ``split.items``) into ``tags/``, then,
    once they cover the catalog, train the projection into ``tags/embed/``; the summary.

    Resumes the parts a killed run left, as ``recsys tag`` does; the model loads before any part is
    cleared, so a model that cannot load costs nothing.
    """
    if len(texts) != len(split.items):
        raise ValueError(f"{len(texts)} item texts for a catalog of {len(split.items)} items")
    check_model_dir(model_dir)
    out = Path(artifact_dir) / "tags"
    out.mkdir(parents=True, exist_ok=True)
    version = hidden_version(model_dir, texts, settings, chunk_size, batch_size, split.items["item_id"].tolist())
    job = TagJob(out, split.items, version, chunk_size, batch_size, limit)
    pending, damaged = plan(job, fresh)
    encoder = load_or_refuse(HiddenEncoder(model_dir, texts, settings), model_dir) if pending else None
    start(job, fresh, damaged)
    t0 = time.perf_counter()
    if encoder is not None:
        run_local(job, encoder.embed_batch, pending, progress)
    seconds = time.perf_counter() - t0
    frame = finalize(job)
    n_now = sum(len(job.chunk_items(c)) for c in pending)
    summary: dict[str, Any] = {
        "method": EMBED_METHOD, "items": len(frame), "items_encoded_this_run": n_now, "seconds": round(seconds, 2),
        "items_per_s": round(n_now / seconds, 2) if seconds > 0 and n_now else None,
        "catalog_items": len(split.items), "table_written": len(frame) == len(split.items),
        "damaged_parts": {job.part_path(c).name: why for c, why in damaged.items()}, "version": version,
        "out_dir": str(out)}
    if summary["table_written"]:
        meta = train_embeddings(split, out, embed or EmbedSettings())
        summary["projection"] = {"dim": int(meta["settings"]["dim"]), "pairs": meta["pairs"],
                                 "seconds": round(meta["seconds"], 2),
                                 "loss_first_last": [meta["loss_per_epoch"][0], meta["loss_per_epoch"][-1]]}
    atomic_write_json(out / "summary.json", summary, default=str)
    return summary

