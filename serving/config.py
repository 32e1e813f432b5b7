"""Configuration of the HTTP service (``settings.serving``).

Request-shape limits that depend on the pipeline (the largest ``k``) live in
``recsys.config.PipelineConfig.max_k``; this model holds what only the HTTP layer uses.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ServingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = Field("127.0.0.1", description="Interface uvicorn binds to.")
    port: int = Field(8000, ge=1, le=65535, description="TCP port uvicorn binds to.")
    workers: int = Field(1, ge=1, le=64, description="uvicorn worker processes (each loads every artifact).")
    max_body_bytes: int = Field(64 * 1024, ge=1024, description="Requests with larger bodies get 413.")
    max_context_keys: int = Field(32, ge=0, le=1024, description="Most keys a request's `context` may hold.")
    max_context_bytes: int = Field(
        4096, ge=2, description="Largest `context` a request may send, measured as compact JSON."
    )
    ready_timeout_s: float = Field(
        300.0, gt=0, description="How long `start_server_subprocess` waits for /readyz before giving up."
    )
