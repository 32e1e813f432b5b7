"""Configuration of the compliance rules stage: which rule set file applies to which dataset.

The rule set itself (the rules, their thresholds, its ``version``) lives in a YAML file validated
by ``rules.schema``; this model only says where to find it. Deliberately left out: rule
semantics (``rules.engine``).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

RULESETS_DIR = Path(__file__).resolve().parent / "rulesets"


class RulesConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ruleset: Path | None = Field(
        default=None,
        description="Rule set YAML; None picks a packaged rule set by dataset name (see packaged_for_dataset), "
        "falling back to rules/rulesets/default.yaml.",
    )
    packaged_for_dataset: dict[str, str] = Field(
        default_factory=lambda: {"ml-100k": "movielens", "ml-1m": "movielens", "ml-20m": "movielens"},
        description="Dataset name (Split.name) -> packaged rule set name (a file in rules/rulesets/).",
    )

    @field_validator("packaged_for_dataset")
    @classmethod
    def _packaged_exist(cls, value: dict[str, str]) -> dict[str, str]:
        for dataset, name in value.items():
            if not (RULESETS_DIR / f"{name}.yaml").exists():
                known = sorted(p.stem for p in RULESETS_DIR.glob("*.yaml"))
                raise ValueError(f"dataset {dataset!r}: no packaged rule set {name!r}; known: {known}")
        return value

    def ruleset_path(self, dataset: str | None) -> Path:
        """The rule set file for ``dataset``: the explicit one, the packaged match, or the default."""
        if self.ruleset is not None:
            return self.ruleset
        name = self.packaged_for_dataset.get(dataset or "", "default")
        return RULESETS_DIR / f"{name}.yaml"
