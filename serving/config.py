"""Configuration of the HTTP service."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ServingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = Field("127.0.0.1")
    port: int = Field(8000, ge=1, le=65535)
    workers: int = Field(1, ge=1, le=64)
    max_body_bytes: int = Field(64 * 1024, ge=1024, description="Requests with larger bodies get 413.")
