"""Configuration of the compliance rules stage."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


class RulesConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ruleset: Path | None = Field(
        None, description="Rule set YAML; None uses the packaged default (rules/rulesets/default.yaml)."
    )
