"""A toy catalog and small real stages to serve it, for the HTTP tests.

Six films, three users; expected answers are worked out by hand below. Stages (built as
``Cls(spec, <settings section>, **<context>)`` like the real ones, which they ignore, so
``cascade.registry.build_pipeline`` can build them once ``STAGE_KINDS`` points at them with
``use_toy_stage_kinds``):

- ``PopularityRecall`` (kind recall): every observed interaction counts, history excluded,
  ties by item index. Counts: m1 3, m2 3, m4 2, m5 2, m3 1, m6 1.
- ``AudienceRules`` (kind rules): drops adult items unless the user is known to be 18+,
  adds a disclaimer to items riskier than the user's (unknown = 0) risk tolerance.
- ``YearRerank`` (kind llm): newest first, a stand-in re-ranker for the answer path.
- ``FailingStage``: raises ``StageError``; ``MissingArtifactsLLM``: fails to load.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from cascade.registry import STAGE_KINDS
from cascade.settings import Settings
from offline.protocol import make_split
from offline.schema import Dataset
from offline.split import Split
from recsys.config import StageSpec
from recsys.contract import Candidates, Request, StageError
from tests.doubles import PopularityStage

# the gates rules/rulesets/default.yaml enforces on the toy catalog (items rated by audience and risk): a rule
# set replacing it without them says so (rules.gates)
DEFAULT_GATES = ["blocklist:withdrawn_items", "audience_gate:adult", "audience_gate:teen", "risk_tolerance"]

def toy_dataset() -> Dataset:
    items = pd.DataFrame({
        "item_id": ["m1", "m2", "m3", "m4", "m5", "m6"],
        "title": ["Alpha", "Bravo", "Charlie", "Delta", "Echo", "Foxtrot"],
        "year": [1990, 1995, 2000, 2005, 2010, 1985],
        "audience": ["all", "all", "all", "adult", "all", "all"],
        "risk_level": pd.array([0, 0, 2, 0, 0, 0], dtype="Int64"),
    })
    users = pd.DataFrame({
        "user_id": ["u1", "u2", "u3"],
        "age": pd.array([30, 15, 40], dtype="Int64"),
        "gender": ["M", "F", "M"],
        "occupation": ["engineer", "student", "doctor"],
        "zip": ["10001", None, "20002"],
        "risk_tolerance": pd.array([1, None, 3], dtype="Int64"),
    })
    events = [("u1", "m1"), ("u1", "m2"), ("u1", "m3"),
              ("u2", "m1"), ("u2", "m2"), ("u2", "m4"), ("u2", "m5"),
              ("u3", "m1"), ("u3", "m4"), ("u3", "m2"), ("u3", "m6"), ("u3", "m5")]
    inter = pd.DataFrame(events, columns=["user_id", "item_id"])
    inter["rating"] = 4.0
    inter["timestamp"] = inter.groupby("user_id").cumcount() + 1
    return Dataset(name="toy", interactions=inter, items=items, users=users)


def save_toy_split(artifact_dir: Path) -> Split:
    split = make_split(toy_dataset(), k_core=1)
    split.save(Path(artifact_dir) / "split")
    return split


def toy_settings(*stages: StageSpec, max_k: int = 5, **serving: Any) -> Settings:
    specs = stages or (StageSpec(name="recall", kind="recall", on_error="fail"),
                       StageSpec(name="rules", kind="rules", on_error="fail"))
    return Settings.build({"pipeline": {"max_k": max_k, "stages": [s.model_dump() for s in specs]},
                           "serving": dict(serving)})


def use_toy_stage_kinds() -> None:
    """Point the registry's recall/rules/llm kinds at the toy stages (tests and the toy server)."""
    STAGE_KINDS.update(TOY_KINDS)


class PopularityRecall(PopularityStage):
    """``tests.doubles.PopularityStage`` built by the registry, counting every observed interaction."""

    load_gate: threading.Event | None = None  # a test holds loading here to observe /readyz at 503

    def __init__(self, spec: StageSpec, config: Any, **context: Any):
        super().__init__(name=spec.name, log1p=False)
        self.counts: np.ndarray | None = None

    def load(self, artifact_dir: Path) -> None:
        if self.load_gate is not None and not self.load_gate.wait(timeout=30):
            raise TimeoutError("PopularityRecall.load_gate was never opened")
        split = Split.load(Path(artifact_dir) / "split")
        self.counts = split.item_popularity("test") + np.bincount(split.test, minlength=split.n_items)
        self.score = self._scores(self.counts)

    def version(self) -> str:
        return "pop-" + hashlib.sha1(np.asarray(self.counts).tobytes()).hexdigest()[:8]


class AudienceRules:
    reads = ("recall",)
    writes: tuple[str, ...] = ()

    def __init__(self, spec: StageSpec, config: Any, **context: Any):
        self.name = spec.name
        self.items: pd.DataFrame | None = None

    def load(self, artifact_dir: Path) -> None:
        self.items = Split.load(Path(artifact_dir) / "split").items

    def run(self, request: Request, candidates: Candidates) -> Candidates:
        if self.items is None:
            raise StageError("AudienceRules.run before load()")
        rows = self.items.iloc[candidates.items]
        adult_ok = request.user_attrs.get("age", 0) >= 18
        keep = adult_ok | (rows["audience"].to_numpy() != "adult")
        out = candidates.take(np.flatnonzero(keep))
        out.removed = list(candidates.removed) + [(int(i), "audience: adult") for i in candidates.items[~keep]]
        tolerance = request.user_attrs.get("risk_tolerance", 0)
        risk = rows["risk_level"].fillna(0).to_numpy()[keep]
        out.disclaimers = {**candidates.disclaimers,
                           **{int(i): [f"risk level {int(r)}"] for i, r in zip(out.items, risk, strict=True) if r > tolerance}}
        return out

    def version(self) -> str:
        return "toy-rules-1"


class YearRerank:
    reads = ("recall",)
    writes = ("llm",)

    def __init__(self, spec: StageSpec, config: Any, **context: Any):
        self.name = spec.name
        self.years: np.ndarray | None = None

    def load(self, artifact_dir: Path) -> None:
        self.years = Split.load(Path(artifact_dir) / "split").items["year"].to_numpy(np.float32)

    def run(self, request: Request, candidates: Candidates) -> Candidates:
        if self.years is None:
            raise StageError("YearRerank.run before load()")
        return candidates.with_scores("llm", self.years[candidates.items])

    def version(self) -> str:
        return "year-1"


class FailingStage:
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()

    def __init__(self, spec: StageSpec, config: Any, **context: Any):
        self.name = spec.name

    def load(self, artifact_dir: Path) -> None:
        return None

    def run(self, request: Request, candidates: Candidates) -> Candidates:
        raise StageError("toy stage always fails")

    def version(self) -> str:
        return "failing-1"


class MissingArtifactsLLM(YearRerank):
    """An LLM stage whose artifacts are absent: ``load`` raises like a real untrained one."""

    def load(self, artifact_dir: Path) -> None:
        raise FileNotFoundError(f"{artifact_dir}/llm: no adapter here")


# kind -> toy class, what use_toy_stage_kinds puts in cascade.registry.STAGE_KINDS
TOY_KINDS: dict[str, type] = {"recall": PopularityRecall, "rules": AudienceRules, "llm": YearRerank}


def create_toy_app_from_env():  # noqa: ANN201 - uvicorn factory for the subprocess test
    """``serving.run.app_from_env`` with the toy stage kinds registered first."""
    from serving.run import app_from_env

    use_toy_stage_kinds()
    return app_from_env()


def create_real_rules_app_from_env():  # noqa: ANN201 - uvicorn factory for the multi-worker tests
    """Toy popularity recall in front of the real ``rules.stage.RulesStage`` (hot-swappable)."""
    from serving.run import app_from_env

    STAGE_KINDS["recall"] = TOY_KINDS["recall"]
    return app_from_env()
