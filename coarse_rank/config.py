"""Configuration of the LightGBM LambdaRank coarse ranker."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class CoarseConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    num_leaves: int = Field(31, ge=2, le=1024)
    learning_rate: float = Field(0.05, gt=0, le=1)
    n_estimators: int = Field(300, ge=1, le=10_000)
