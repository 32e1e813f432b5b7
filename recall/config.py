"""Configuration of the recall stage (two-tower model, faiss index, popularity channel)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class RecallConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dim: int = Field(64, ge=8, le=1024, description="Embedding dimension of both towers.")
    index: Literal["flat", "ivf", "hnsw"] = Field("flat", description="faiss index kind; flat is exact.")
    popularity_share: float = Field(
        0.1, ge=0.0, le=1.0, description="Share of the recall depth filled from the popularity channel."
    )
