"""Configuration of the compliance rules stage: which rule set file is in force.

The rule set itself (the rules, their thresholds, its ``version``) lives in a YAML file validated
by ``rules.schema``; this model only says where to find it. With no file configured the packaged
``rules/rulesets/default.yaml`` applies: every rule in it says ``on_absent_attribute: skip``, so
on any catalog exactly the rules whose attributes the catalog carries are in force
(``rules.catalog``) -- audience gates only where items carry an audience rating, risk rules
only where they carry a risk level. Nothing depends on the dataset's name.

Deliberately left out: rule semantics (``rules.engine``).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

RULESETS_DIR = Path(__file__).resolve().parent / "rulesets"
DEFAULT_RULESET = RULESETS_DIR / "default.yaml"


class RulesConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ruleset: Path | None = Field(
        default=None,
        description="Rule set YAML; None = the packaged rules/rulesets/default.yaml, whose rules apply where the "
        "catalog carries the attributes they read. Packaged alternatives: rules/rulesets/*.yaml.",
    )

    def ruleset_path(self, explicit: str | Path | None = None) -> Path:
        """The rule set file in force: ``explicit`` (a stage's ``params.ruleset``), the configured one,
        or the packaged default."""
        if explicit:
            return Path(explicit)
        return self.ruleset if self.ruleset is not None else DEFAULT_RULESET
