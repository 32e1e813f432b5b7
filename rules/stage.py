"""The compliance rules stage: filters candidates and attaches disclaimers, keeping their order.

Placed after the scorers and before fusion (``recsys.config.default_stages``) with
``on_error: fail``, so a failure answers nothing rather than something unfiltered.

Category caps and fusion: a cap is about the *served* list, whose order fusion decides. The
stage therefore takes ``params.apply``: ``filters`` (blocklists, gates, disclaimers; placed
before fusion so fusion never sees a forbidden item), ``caps`` (category caps only; placed
after fusion, walking the fused order greedily best-first), or ``all`` (both, on the order it
receives; used when a pipeline has no fusion). The default pipeline runs
``rules (filters) -> fusion -> caps (caps)``, both with ``on_error: fail``.

Deliberately left out: rule semantics (``rules.engine``) and the file format (``rules.schema``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from offline.split import Split
from recsys.config import StageSpec
from recsys.contract import Candidates, Request
from rules.catalog import CatalogAttributes, Resolution, resolve
from rules.config import APPLY, RulesConfig
from rules.engine import apply_rules
from rules.items import ItemAttributes
from rules.schema import RuleSet, load_ruleset


class RulesStage:
    """``recsys.contract.Stage`` evaluating a ``RuleSet`` on ``request.user_attrs``."""

    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()

    def __init__(self, spec: StageSpec, config: RulesConfig):
        """``config`` is ``settings.rules``: the rule set file in force unless ``spec.params.ruleset``."""
        self.name = spec.name
        self.spec = spec
        self.config = config
        self.ruleset: RuleSet | None = None
        self._active: RuleSet | None = None  # ruleset minus the rules skipped on this catalog
        self.items: ItemAttributes | None = None
        self.ruleset_path: Path | None = None
        self.carried = CatalogAttributes.everything()
        self.skipped: dict[str, str] = {}  # rule id -> why it is off on this catalog (rules.catalog)
        self.apply = spec.params.get("apply", "all")
        if self.apply not in APPLY:
            raise ValueError(f"stage {spec.name!r}: params.apply must be all, filters or caps, got {self.apply!r}")

    def load(self, artifact_dir: Any) -> None:
        """Read the rule set and the item attribute arrays from ``artifact_dir/split``.

        The rule set is ``spec.params['ruleset']`` when given, else ``config`` decides (an
        explicit file, or the packaged default). A rule that reads an attribute this
        catalog does not carry is refused here, by name (``rules.catalog``).
        """
        split = Split.load(Path(artifact_dir) / "split")
        self.install_catalog(split.items, split.users, self.ruleset_file())

    def ruleset_file(self) -> Path:
        """The rule set file this stage loads: ``spec.params['ruleset']``, else ``config``'s."""
        return self.config.ruleset_path(self.spec.params.get("ruleset"))

    def install_catalog(self, items: Any, users: Any, path: Path) -> None:
        """Use the rule set at ``path`` on the catalog ``items``/``users`` (canonical tables)."""
        self.carried = CatalogAttributes.of(items, users)
        self.use(load_ruleset(path), ItemAttributes.from_items(items))
        self.ruleset_path = path

    def check(self, ruleset: RuleSet) -> Resolution:
        """The rules of ``ruleset`` in force on this stage's catalog; ``RulesError`` naming the rule and
        the attribute when one cannot judge it (called before an admin publish and by ``use``)."""
        return resolve(ruleset, self.carried)

    def use(self, ruleset: RuleSet, items: ItemAttributes) -> None:
        """Install an already-loaded rule set and item table (hot swap, tests, evaluator).

        ``self.ruleset`` keeps the whole rule set (its version is what responses report);
        the rules skipped on this catalog are left out of evaluation and listed in ``skipped``.
        """
        resolution = self.check(ruleset)
        self.ruleset, self.items = ruleset, items
        self._active, self.skipped = resolution.ruleset, resolution.skipped

    @property
    def active(self) -> RuleSet | None:
        """The rule set in force on this catalog (``ruleset`` minus the rules skipped here)."""
        return self._active

    def version(self) -> str:
        return self.ruleset.version if self.ruleset is not None else "unloaded"

    def run(self, request: Request, candidates: Candidates) -> Candidates:
        if self._active is None or self.items is None:
            raise RuntimeError(f"stage {self.name!r}: run() before load()")
        outcome = apply_rules(self._active, request.user_attrs, self.items, candidates.items, apply=self.apply)
        out = candidates.take(np.flatnonzero(outcome.keep))
        # take() shares the dict/list objects with its input; copy them so the input is untouched
        out.disclaimers = {k: list(v) for k, v in candidates.disclaimers.items()}
        for item, texts in outcome.disclaimers.items():
            have = out.disclaimers.setdefault(item, [])
            have.extend(t for t in texts if t not in have)
        out.removed = list(candidates.removed)
        if request.debug:
            out.removed.extend(outcome.removed)
        return out
