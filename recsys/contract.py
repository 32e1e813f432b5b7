"""The pipeline contract: one request type, one columnar candidate set, one stage interface.

Every stage (recall channel, coarse ranker, LLM re-ranker, rules, fusion) is a ``Stage``:
``run(request, candidates) -> candidates``. Candidates travel as one ``Candidates`` object
holding parallel arrays (catalog item indices, one float32 score array per stage, one bool
array per flag) instead of per-item dicts, in the spirit of vLLM's typed hand-offs.

Item and user identity: every model works on contiguous *indices* (``item_idx`` in
``[0, n_items)``, ``user_idx`` in ``[0, n_users)``) assigned by ``offline.schema.Vocab``;
external ids (strings) appear only at the edges (HTTP, reports).

Optional capabilities: a stage that can do more than ``run`` says so by implementing one of the
small protocols at the end of this module (``Pinnable``, ``Backfilling``, ``ReloadableRules``,
``PromptHolder``, ``PromptBuilding``, ``ServedModel``, ``ChannelRecall``, ``WeightsLookup``,
``ArtifactSubdir``); callers ask ``isinstance(stage, Protocol)``, never ``getattr``/``hasattr``.
They are typed with ``Any`` where the concrete type belongs to a stage package (a rule set, a
prompt template), since this core imports no stage.

Deliberately left out: any notion of HTTP, threads or model loading (see ``recsys.pipeline``
for running stages, ``serving`` for HTTP).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

StageStatus = Literal["ok", "skipped", "fallback", "error"]


@dataclass(frozen=True)
class Request:
    """One recommendation request, as the stages see it.

    ``history`` is the user's time-ordered item indices (oldest first), already merged with
    real-time events by the caller. ``exclude`` lists item indices never to recommend
    (by default the history). ``user_idx`` is None for a user unknown to the trained models
    (cold start); ``user_attrs`` holds the user's attributes (age, gender, occupation,
    risk_tolerance, ...) with missing ones absent.
    """

    user_id: str
    k: int = 10
    user_idx: int | None = None
    history: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    exclude: np.ndarray | None = None
    user_attrs: Mapping[str, Any] = field(default_factory=dict)
    context: Mapping[str, Any] = field(default_factory=dict)
    debug: bool = False
    deadline: float | None = None  # absolute time.monotonic() by which the answer is due
    variant: str | None = None  # A/B variant name, when an experiment assigned one
    request_id: str = ""

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"Request.k must be >= 1, got {self.k}")
        hist = np.asarray(self.history, dtype=np.int64)
        object.__setattr__(self, "history", hist)
        if self.exclude is not None:
            object.__setattr__(self, "exclude", np.asarray(self.exclude, dtype=np.int64))

    @property
    def excluded(self) -> np.ndarray:
        """Items not to recommend: ``exclude`` when given, else the history."""
        return self.history if self.exclude is None else self.exclude

    def remaining_s(self) -> float:
        """Seconds left before the request deadline (``inf`` without one)."""
        if self.deadline is None:
            return float("inf")
        return self.deadline - time.monotonic()


@dataclass
class Candidates:
    """A columnar candidate set: item indices plus aligned per-stage scores and flags.

    ``scores[stage]`` holds that stage's score per candidate (higher is better; NaN where
    the stage did not score the item). ``flags[name]`` holds a bool per candidate (for
    example ``"src_popularity"``). ``order_by`` names the score array that defines the
    current order; stages keep the arrays sorted by it. ``notes`` carries per-item strings
    attached by stages, keyed by item index (disclaimers, debug reasons).
    """

    items: np.ndarray
    scores: dict[str, np.ndarray] = field(default_factory=dict)
    flags: dict[str, np.ndarray] = field(default_factory=dict)
    order_by: str | None = None
    disclaimers: dict[int, list[str]] = field(default_factory=dict)
    removed: list[tuple[int, str]] = field(default_factory=list)  # (item_idx, reason), debug

    def __post_init__(self) -> None:
        self.items = np.asarray(self.items, dtype=np.int64)
        n = len(self.items)
        for kind, cols in (("scores", self.scores), ("flags", self.flags)):
            for name, arr in cols.items():
                if len(arr) != n:
                    raise ValueError(f"Candidates.{kind}[{name!r}] has {len(arr)} rows, items has {n}")

    def __len__(self) -> int:
        return len(self.items)

    @classmethod
    def empty(cls) -> Candidates:
        return cls(items=np.zeros(0, dtype=np.int64))

    def take(self, idx: np.ndarray) -> Candidates:
        """Rows ``idx`` (an index array or bool mask), every column kept aligned."""
        idx = np.asarray(idx)
        return Candidates(
            items=self.items[idx],
            scores={k: v[idx] for k, v in self.scores.items()},
            flags={k: v[idx] for k, v in self.flags.items()},
            order_by=self.order_by,
            disclaimers=self.disclaimers,
            removed=self.removed,
        )

    def head(self, n: int) -> Candidates:
        return self.take(np.arange(min(n, len(self))))

    def with_scores(self, name: str, values: np.ndarray, *, reorder: bool = True) -> Candidates:
        """Attach score column ``name``; with ``reorder`` sort by it (stable, descending, NaN last)."""
        values = np.asarray(values, dtype=np.float32)
        if len(values) != len(self):
            raise ValueError(f"score {name!r} has {len(values)} rows, candidates have {len(self)}")
        out = Candidates(
            items=self.items,
            scores={**self.scores, name: values},
            flags=dict(self.flags),
            order_by=self.order_by,
            disclaimers=self.disclaimers,
            removed=self.removed,
        )
        return out.sorted_by(name) if reorder else out

    def sorted_by(self, name: str) -> Candidates:
        """Stable sort by score ``name`` descending; NaN sorts last."""
        s = self.scores[name]
        key = np.where(np.isnan(s), -np.inf, s)
        order = np.argsort(-key, kind="stable")
        out = self.take(order)
        out.order_by = name
        return out

    def score(self, name: str) -> np.ndarray:
        """Score column ``name``, or all-NaN when that stage did not run."""
        if name in self.scores:
            return self.scores[name]
        return np.full(len(self), np.nan, dtype=np.float32)


@dataclass(frozen=True)
class StageTrace:
    """What happened in one stage for one request (recorded on every request)."""

    name: str
    status: StageStatus
    ms: float
    n_in: int
    n_out: int
    reason: str = ""


@runtime_checkable
class Stage(Protocol):
    """The one stage interface.

    Called by ``recsys.pipeline.Pipeline`` once per request, in config order, on the
    request thread. ``load`` is called once at start-up (or on artifact swap) by whoever
    builds the pipeline, never at import and never per request. ``run`` must not mutate
    its input ``Candidates``; it returns a new set holding at most ``depth`` rows when the
    pipeline configured one. Stages that can stop early should watch ``request.remaining_s()``.
    """

    name: str
    reads: tuple[str, ...]  # score columns it needs (documentation + validation)
    writes: tuple[str, ...]  # score columns it adds

    def load(self, artifact_dir: Any) -> None: ...

    def run(self, request: Request, candidates: Candidates) -> Candidates: ...

    def version(self) -> str:
        """A short version string of the loaded artifact (model hash, rule set version)."""
        ...


class StageError(RuntimeError):
    """A stage could not produce an answer; the pipeline applies that stage's fallback."""


# -- optional capabilities: each protocol names the callers that ask for it ------------------------


@runtime_checkable
class Pinnable(Protocol):
    """A stage whose state is swapped while serving (rules views, prompt templates).

    ``recsys.pipeline.Pipeline.snapshot`` calls ``pinned`` once per request, under
    ``recsys.pipeline.STAGE_SWAP``, and runs the returned stage: one answer never mixes two versions.
    """

    def pinned(self) -> Stage: ...


@runtime_checkable
class Backfilling(Protocol):
    """A stage that can hand out candidates beyond its depth (recall's popularity channel).

    ``recsys.pipeline.Pipeline`` asks ``more`` when the policy stages left a list short of ``k``.
    """

    def more(self, request: Request, size: int) -> Iterator[np.ndarray]: ...


@runtime_checkable
class ReloadableRules(Protocol):
    """A policy stage whose rule set can be swapped at run time (``rules.stage.RulesStage``).

    ``serving.document_reload.RulesApplier`` calls ``check`` before publishing, ``prepare`` on every
    stage before ``install`` on any (so all stages take the rule set or none does), and reads
    ``ruleset_path`` to re-seed an empty version store. The evaluator reads ``active`` and
    ``skipped`` for the cost of each rule. ``Any`` stands for ``rules.schema.RuleSet``,
    ``rules.attribute_coverage.Resolution`` and ``rules.stage.RulesView``.
    """

    @property
    def ruleset(self) -> Any: ...

    @property
    def active(self) -> Any: ...

    @property
    def skipped(self) -> dict[str, str]: ...

    @property
    def ruleset_path(self) -> Path | None: ...

    def check(self, ruleset: Any) -> Any: ...

    def prepare(self, ruleset: Any) -> Any: ...

    def install(self, view: Any) -> None: ...


@runtime_checkable
class PromptHolder(Protocol):
    """A stage serving a versioned prompt template (``llm_rerank.template.PromptTemplate``).

    ``serving.document_reload.PromptApplier`` calls ``set_prompt_template`` with a validated template
    (an admin PUT or the version watcher); the stage serves it from the next request on.
    """

    def set_prompt_template(self, template: Any) -> None: ...


@runtime_checkable
class PromptBuilding(Protocol):
    """A stage that scores with a prompt (the LLM re-ranker): the evaluator and the A/B comparison
    count its prompt tokens by building the prompt of a request (``llm_rerank.prompt.PromptParts``)."""

    def build_prompt(self, request: Request, item_idx: np.ndarray) -> Any: ...


@runtime_checkable
class ServedModel(Protocol):
    """A stage that serves a trained model from a folder it records after ``load`` ("" before);
    the fusion gate reads the users that model trained on from there."""

    @property
    def model_location(self) -> str | Path: ...


@runtime_checkable
class ChannelRecall(Protocol):
    """A recall stage that can return each channel's own list (the evaluator's channel recall).

    Returns ``(channel name, item indices, scores)`` per channel.
    """

    def channel_lists(self, history: np.ndarray, exclude: np.ndarray,
                      vector: np.ndarray) -> list[tuple[str, np.ndarray, np.ndarray]]: ...


@runtime_checkable
class WeightsLookup(Protocol):
    """A stage that mixes other stages' scores with tuned weights (fusion).

    ``weights_key`` names the folder its weights load from (``<artifacts>/fusion/<key>``, read by
    ``cascade.registry`` to check the artifacts); ``weights_for`` gives the weights it applies to a
    candidate set (the debug answer's hand-offs, ``serving.response``).
    """

    weights_key: str

    def weights_for(self, candidates: Candidates) -> dict[str, float]: ...


@runtime_checkable
class ArtifactSubdir(Protocol):
    """A stage that loads from ``<artifacts>/<subdir>`` rather than from the folder named by its
    kind (the coarse ranker, to serve a variant beside the default); read by ``cascade.registry``."""

    subdir: str
