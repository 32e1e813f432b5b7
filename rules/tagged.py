"""The rules stage over the LLM-tagged items table (stage kind ``rules_tagged``).

Same rules, same rule set resolution as ``rules.stage.RulesStage``; only the item attributes
come from ``<artifact_dir>/tags/items.parquet`` (written by ``recsys tag merge-items``), where
``attributes["tags"]`` holds the LLM tags (``genre:...``, ``theme:...``, ``risk:...``) and a
missing ``audience`` is filled from the tag. Enable by setting ``kind: rules_tagged`` on the
rules stages in the pipeline YAML.

Deliberately left out: producing the tags (``offline.tagging``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rules.items import ItemAttributes
from rules.schema import load_ruleset
from rules.stage import RulesStage


class TaggedRulesStage(RulesStage):
    def load(self, artifact_dir: Any) -> None:
        from offline.split import Split
        from offline.tagging.wiring import load_tagged_items

        split = Split.load(Path(artifact_dir) / "split")
        items = load_tagged_items(Path(artifact_dir))
        if items["item_id"].tolist() != split.items["item_id"].tolist():
            raise ValueError(f"{artifact_dir}/tags/items.parquet does not match the split's items: re-run merge-items")
        explicit = self.spec.params.get("ruleset")
        path = Path(explicit) if explicit else self.settings.rules.ruleset_path(split.name)
        self.use(load_ruleset(path), ItemAttributes.from_items(items))
        self.ruleset_path = path
