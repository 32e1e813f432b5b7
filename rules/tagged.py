"""The rules stage over the LLM-tagged items table (stage kind ``rules_tagged``).

Same rules, same rule set resolution as ``rules.stage.RulesStage``; only the item attributes
come from ``<artifact_dir>/tags/items.parquet`` (written by ``recsys tag merge-items``), where
``attributes["tags"]`` holds the LLM tags (``genre:...``, ``theme:...``, ``risk:...``) and a
missing ``audience`` is filled from the tag. Enable by setting ``kind: rules_tagged`` on the
rules stages in the pipeline YAML.

Deliberately left out: producing the tags (``jobs.tagging``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from offline.split import Split
from offline.tag_store import load_tagged_items
from rules.stage import RulesStage


class TaggedRulesStage(RulesStage):
    def load(self, artifact_dir: Any) -> None:
        split = Split.load(Path(artifact_dir) / "split")
        items = load_tagged_items(Path(artifact_dir))
        if items["item_id"].tolist() != split.items["item_id"].tolist():
            raise ValueError(f"{artifact_dir}/tags/items.parquet does not match the split's items: re-run merge-items")
        self.install_catalog(items, split.users, self.ruleset_file())
