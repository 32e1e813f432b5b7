"""The compliance rules stage: filters candidates and attaches disclaimers, keeping their order.

Placed after the scorers and before fusion (``recsys.config.default_stages``) with
``on_error: fail``, so a failure answers nothing rather than something unfiltered.

Category caps and fusion: a cap is about the *served* list, whose order fusion decides. The
stage therefore takes ``params.apply``: ``filters`` (blocklists, gates, disclaimers; placed
before fusion so fusion never sees a forbidden item), ``caps`` (category caps only; placed
after fusion, walking the fused order greedily best-first), or ``all`` (both, on the order it
receives; used when a pipeline has no fusion). The default pipeline runs
``rules (filters) -> fusion -> caps (caps)``, both with ``on_error: fail``.

One version per answer: what a stage enforces (the rule set, the rules in force on this
catalog, the item arrays) is one immutable ``RulesView``, replaced by one reference assignment.
``recsys.pipeline.Pipeline`` pins every stage once per request (``pinned``), under the lock
``serving.document_reload`` holds while it swaps the views of all rules stages, so the filters and the
caps of one answer, and the version it reports, are always the same rule set.

Deliberately left out: rule semantics (``rules.engine``) and the file format (``rules.schema``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from offline.split import Split
from recsys.config import StageSpec
from recsys.contract import Candidates, Request
from rules.attribute_coverage import CatalogAttributes, Resolution, resolve
from rules.config import APPLY, RulesConfig
from rules.engine import apply_rules
from rules.items import ItemAttributes
from rules.schema import RuleSet, load_ruleset


@dataclass(frozen=True)
class RulesView:
    """One version of what a rules stage enforces; never changed once built (swapped whole)."""

    ruleset: RuleSet  # the whole rule set: its version is what answers report
    active: RuleSet  # the rules in force on this catalog (``ruleset`` minus the skipped ones)
    items: ItemAttributes
    skipped: dict[str, str] = field(default_factory=dict)  # rule id -> why it is off on this catalog


class PinnedRules:
    """A rules stage fixed on one ``RulesView`` for one request (``RulesStage.pinned``)."""

    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()

    def __init__(self, name: str, apply: Literal["all", "filters", "caps"], view: RulesView):
        self.name, self.apply, self.view = name, apply, view

    def load(self, artifact_dir: Any) -> None:
        """Nothing to load: the view is loaded already."""

    def version(self) -> str:
        return self.view.ruleset.version

    def run(self, request: Request, candidates: Candidates) -> Candidates:
        view = self.view
        outcome = apply_rules(view.active, request.user_attrs, view.items, candidates.items, apply=self.apply)
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


class RulesStage:
    """``recsys.contract.Stage`` evaluating a ``RuleSet`` on ``request.user_attrs``."""

    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()

    def __init__(self, spec: StageSpec, config: RulesConfig):
        """``config`` is ``settings.rules``: the rule set file in force unless ``spec.params.ruleset``."""
        self.name = spec.name
        self.spec = spec
        self.config = config
        self.view: RulesView | None = None  # replaced whole, never changed in place
        self.ruleset_path: Path | None = None
        self.carried = CatalogAttributes.everything()
        self.apply: Literal["all", "filters", "caps"] = spec.params.get("apply", "all")
        if self.apply not in APPLY:
            raise ValueError(f"stage {spec.name!r}: params.apply must be all, filters or caps, got {self.apply!r}")

    def load(self, artifact_dir: Any) -> None:
        """Read the rule set and the item attribute arrays from ``artifact_dir/split``.

        The rule set is ``spec.params['ruleset']`` when given, else ``config`` decides (an
        explicit file, or the packaged default). A rule that reads an attribute this
        catalog does not carry is refused here, by name (``rules.attribute_coverage``).
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

    def prepare(self, ruleset: RuleSet, items: ItemAttributes | None = None) -> RulesView:
        """The view ``ruleset`` would install (``RulesError`` when this catalog cannot judge it); installs
        nothing, so several stages can all be checked before any of them swaps (``serving.document_reload``)."""
        items = items if items is not None else self.items
        if items is None:
            raise RuntimeError(f"stage {self.name!r}: prepare() before load()")
        resolution = self.check(ruleset)
        return RulesView(ruleset, resolution.ruleset, items, resolution.skipped)

    def install(self, view: RulesView) -> None:
        """Serve ``view`` from the next pinned request on (one reference assignment)."""
        self.view = view

    def use(self, ruleset: RuleSet, items: ItemAttributes | None = None) -> None:
        """Install an already-loaded rule set and item table (hot swap, tests, evaluator).

        ``ruleset`` keeps the whole rule set (its version is what responses report);
        the rules skipped on this catalog are left out of evaluation and listed in ``skipped``.
        """
        self.install(self.prepare(ruleset, items))

    @property
    def ruleset(self) -> RuleSet | None:
        return self.view.ruleset if self.view is not None else None

    @property
    def items(self) -> ItemAttributes | None:
        return self.view.items if self.view is not None else None

    @property
    def skipped(self) -> dict[str, str]:
        """Rule id -> why it is off on this catalog (``rules.attribute_coverage``)."""
        return self.view.skipped if self.view is not None else {}

    @property
    def active(self) -> RuleSet | None:
        """The rule set in force on this catalog (``ruleset`` minus the rules skipped here)."""
        return self.view.active if self.view is not None else None

    def version(self) -> str:
        return self.view.ruleset.version if self.view is not None else "unloaded"

    def pinned(self) -> PinnedRules | RulesStage:
        """This stage fixed on the view it serves now, for one request (``Pipeline.snapshot``); itself
        before ``load``, so the request fails in ``run`` as a stage failure (fail closed)."""
        return self if self.view is None else PinnedRules(self.name, self.apply, self.view)

    def run(self, request: Request, candidates: Candidates) -> Candidates:
        view = self.view
        if view is None:
            raise RuntimeError(f"stage {self.name!r}: run() before load()")
        return PinnedRules(self.name, self.apply, view).run(request, candidates)
