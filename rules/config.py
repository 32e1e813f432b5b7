"""Configuration of the compliance rules stage: which rule set file is in force.

The rule set itself (the rules, their thresholds, its ``version``) lives in a YAML file validated
by ``rules.schema``; this model only says where to find it. With no file configured the packaged
``rules/rulesets/default.yaml`` applies: every rule in it says ``on_absent_attribute: skip``, so
on any catalog exactly the rules whose attributes the catalog carries are in force
(``rules.attribute_coverage``) -- audience gates only where items carry an audience rating, risk rules
only where they carry a risk level. Nothing depends on the dataset's name.

Deliberately left out: rule semantics (``rules.engine``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rules.schema import load_ruleset

RULESETS_DIR = Path(__file__).resolve().parent / "rulesets"
DEFAULT_RULESET = RULESETS_DIR / "default.yaml"
APPLY = ("all", "filters", "caps")  # what a rules stage's params.apply may say (rules.stage)


class RulesConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ruleset: Path | None = Field(
        default=None,
        description="Rule set YAML; None = the packaged rules/rulesets/default.yaml, whose rules apply where the "
        "catalog carries the attributes they read. Packaged alternatives: rules/rulesets/*.yaml.",
    )

    @field_validator("ruleset")
    @classmethod
    def _loads(cls, value: Path | None) -> Path | None:
        if value is not None:
            load_ruleset(value)  # missing, a directory, not YAML, beyond the bounds, or invalid: refused now
        return value

    def check_stage_params(self, stage: str, params: dict[str, Any]) -> None:
        """Refuse a rules stage's ``params`` now (a bad ``apply``, or a rule set file that is missing
        or invalid) rather than when the pipeline is first built, minutes into training."""
        if params.get("apply", "all") not in APPLY:
            raise ValueError(f"stage {stage!r}: params.apply must be all, filters or caps, got {params['apply']!r}")
        if params.get("ruleset"):
            load_ruleset(params["ruleset"])

    def ruleset_path(self, explicit: str | Path | None = None) -> Path:
        """The rule set file in force: ``explicit`` (a stage's ``params.ruleset``), the configured one,
        or the packaged default."""
        if explicit:
            return Path(explicit)
        return self.ruleset if self.ruleset is not None else DEFAULT_RULESET
