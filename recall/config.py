"""Configuration of the recall stage (two-tower model, faiss index, popularity channel).

Defaults are tuned on ML-100K (5-core, leave-one-out, full ranking) to train in a few
minutes on one CPU core; see ``recall.train`` for the measured figures.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class RecallConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # -- model --------------------------------------------------------------------------
    dim: int = Field(64, ge=8, le=1024, description="Embedding dimension of both towers.")
    max_len: int = Field(50, ge=1, le=1024, description="Most recent history items the user tower reads.")
    n_blocks: int = Field(2, ge=1, le=8, description="Causal self-attention blocks in the user tower.")
    n_heads: int = Field(2, ge=1, le=16, description="Attention heads per block; must divide dim.")
    dropout: float = Field(0.3, ge=0.0, lt=1.0, description="Dropout on embeddings, attention and FFN.")
    temperature: float = Field(
        0.05, gt=0.0, le=10.0, description="Score = cosine(user, item) / temperature in the training softmax."
    )
    use_text: bool = Field(True, description="Add projected MiniLM title/text embeddings to the item tower.")
    # -- training -----------------------------------------------------------------------
    lr: float = Field(2e-3, gt=0.0, le=1.0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0.0, le=1.0, description="AdamW decoupled weight decay.")
    batch_size: int = Field(128, ge=1, le=65_536, description="Training windows per step.")
    max_epochs: int = Field(200, ge=1, le=10_000, description="Upper bound on training epochs.")
    patience: int = Field(3, ge=1, le=1000, description="Evaluations without improvement before stopping.")
    eval_every: int = Field(2, ge=1, le=1000, description="Epochs between early-stopping evaluations.")
    # 1 by default: on a shared 2-core box, 2 threads ran ~9x slower per step than 1 (OpenMP
    # worker threads stall while the cores are busy); set 0 on a dedicated machine.
    train_threads: int = Field(
        1, ge=0, le=256, description="torch CPU threads for training; 0 = one per available core."
    )
    max_train_s: float = Field(240.0, gt=0, description="Wall-clock cap on training; the best model so far is kept.")
    loss: Literal["auto", "full", "sampled"] = Field(
        "auto", description="full softmax over the catalog, sampled softmax with logQ correction, or auto."
    )
    full_softmax_max_items: int = Field(
        50_000, ge=1, description="With loss=auto, catalogs up to this size use the full softmax."
    )
    n_negatives: int = Field(1024, ge=1, le=1_000_000, description="Shared negatives per step (sampled loss).")
    # -- serving ------------------------------------------------------------------------
    index: Literal["flat", "ivf", "hnsw"] = Field("flat", description="faiss index kind; flat is exact.")
    merge_order: Literal["interleave", "priority"] = Field(
        "priority",
        description="How channel lists merge: 'priority' keeps the two-tower order on top and appends the "
        "popularity quota after it; 'interleave' deals slots Sainte-Lague style (popularity every ~10th slot).",
    )
    popularity_share: float = Field(
        0.1, ge=0.0, le=1.0, description="Share of the recall depth filled from the popularity channel."
    )
    cold_popularity_share: float = Field(
        0.8, ge=0.0, le=1.0, description="Popularity share for a user with an empty history."
    )

    @model_validator(mode="after")
    def _check(self) -> RecallConfig:
        if self.dim % self.n_heads:
            raise ValueError(f"recall.dim ({self.dim}) must be divisible by recall.n_heads ({self.n_heads})")
        return self

    def uses_full_softmax(self, n_items: int) -> bool:
        """Whether training scores every catalog item (cheap below ~50k items, and the better loss)."""
        if self.loss == "auto":
            return n_items <= self.full_softmax_max_items
        return self.loss == "full"
