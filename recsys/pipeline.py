"""Runs the configured stages in order, timing each, applying depths, budgets and fallbacks.

``Pipeline.run`` is plain synchronous Python: the serving layer calls it from a worker
thread, the evaluator calls it in a loop. Per stage:

- disabled in config, or in ``skip`` for this request (traffic policy) -> ``skipped``;
- raised, or the request deadline already passed -> with ``on_error: passthrough`` the
  previous order is kept (``fallback``, with the reason); with ``on_error: fail`` a
  ``PipelineError`` is raised (rules fail closed this way);
- finished past its ``budget_ms`` -> a passthrough stage falls back as above; a required
  (``fail``) stage keeps its late output, flagged in the trace's reason (a late answer beats
  none, and there is no earlier order to fall back to);
- otherwise its output is cut to ``depth`` (``ok``).

What a ranking stage's depth cuts off (its output past ``depth``, then the input items it did
not hand back, e.g. the candidates past the LLM's 20, in their incoming order) is kept for
the request as that stage's *tail*: a list the policy stages leave short is filled from the
tails first (``Pipeline._backfill``). Stages therefore return everything they ranked and let
the pipeline cut; a stage that cut itself would hide its tail.

Each stage sees the request with ``deadline`` set to the tighter of the request deadline
and its own budget, so a stage that can stop early (the LLM) knows when to. A passthrough
stage with a budget also runs under a watchdog (``recsys.watchdog``): a backend that hangs
inside one call (a stuck forward pass, a dead socket) cannot check its deadline, so the
pipeline stops waiting ``WATCHDOG_GRACE_S`` after that deadline and falls back; the call is
abandoned on its thread, and while ``MAX_ABANDONED`` calls of a stage are still stuck, the
stage falls back at once instead of taking another thread.

One snapshot per request: a stage whose state is swapped at run time (a rule set published
while serving) offers ``pinned()``, a copy fixed on what it serves now. ``snapshot`` pins every
stage once, under ``STAGE_SWAP`` (held by whoever swaps several stages together, so a request
never pins half of a swap), and ``run`` uses only that snapshot: every stage of one answer, and
the ``versions`` it reports, come from one moment, whatever is published meanwhile.

Deliberately left out: building stages from config (``cascade.registry``) and HTTP.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from recsys.config import POLICY_KINDS, StageSpec
from recsys.contract import Backfilling, Candidates, Pinnable, Request, Stage, StageTrace
from recsys.watchdog import StageAbandoned, StageWatchdog

log = logging.getLogger(__name__)

# Held while stages are pinned for a request and while several stages are swapped together
# (serving.document_reload), so a request sees all of a swap or none of it.
STAGE_SWAP = threading.RLock()


class PipelineError(RuntimeError):
    """A stage with ``on_error: fail`` failed; the request cannot be answered safely."""

    def __init__(self, stage: str, reason: str, traces: list[StageTrace]):
        super().__init__(f"stage {stage!r} failed: {reason}")
        self.stage = stage
        self.reason = reason
        self.traces = traces


@dataclass
class PipelineResult:
    candidates: Candidates  # final order, cut to request.k
    traces: list[StageTrace]
    versions: dict[str, str] = field(default_factory=dict)
    short_by: int = 0  # how many items fewer than request.k the answer holds (0 = complete)
    short_reason: str = ""  # why it is short, when it is

    @property
    def complete(self) -> bool:
        return self.short_by == 0

    @property
    def fallbacks(self) -> list[str]:
        return [t.name for t in self.traces if t.status == "fallback"]

    @property
    def ran(self) -> list[str]:
        return [t.name for t in self.traces if t.status == "ok"]

    @property
    def total_ms(self) -> float:
        return sum(t.ms for t in self.traces)


@dataclass(frozen=True)
class PipelineSnapshot:
    """The stages one request runs, each pinned on what it served when the request began."""

    stages: tuple[tuple[StageSpec, Stage], ...]
    versions: dict[str, str]


# per stage class: whether it is ``Pinnable``; a runtime protocol check walks the protocol's members on
# every call (~25 us), and ``snapshot`` asks it for every stage of every request
_PINNABLE: dict[type, bool] = {}


def pin(stage: Stage) -> Stage:
    """``stage.pinned()`` for a stage whose state is swapped while serving, else the stage itself."""
    kind = type(stage)
    pinnable = _PINNABLE.get(kind)
    if pinnable is None:
        pinnable = _PINNABLE[kind] = isinstance(stage, Pinnable)
    return cast(Pinnable, stage).pinned() if pinnable else stage


class Pipeline:
    """An ordered list of (spec, stage) pairs; built by ``cascade.registry.build_pipeline``."""

    def __init__(self, stages: Sequence[tuple[StageSpec, Stage]], request_budget_ms: float | None = None):
        self.stages = list(stages)
        self.request_budget_ms = request_budget_ms
        self.watchdog = StageWatchdog()

    def without_budgets(self) -> Pipeline:
        """The same stages with no stage budget and no request deadline, for the offline jobs
        (evaluation, tuning, training data): what they measure is what the stages rank, which must not
        depend on how loaded the machine is (a coarse call past its 200 ms on a busy machine would
        otherwise be replaced by recall's order). The budgets are the benchmarks' to measure."""
        out = Pipeline([(spec.model_copy(update={"budget_ms": None}), stage) for spec, stage in self.stages])
        out.watchdog = self.watchdog
        return out

    def stage(self, name: str) -> Stage:
        for spec, stage in self.stages:
            if spec.name == name:
                return stage
        raise KeyError(f"no stage named {name!r}")

    def versions(self) -> dict[str, str]:
        return {spec.name: stage.version() for spec, stage in self.stages if spec.enabled}

    def snapshot(self) -> PipelineSnapshot:
        """Every stage pinned once (see the module doc), with the versions they will run."""
        with STAGE_SWAP:
            stages = tuple((spec, pin(stage)) for spec, stage in self.stages)
        return PipelineSnapshot(stages, {spec.name: stage.version() for spec, stage in stages if spec.enabled})

    def run(
        self,
        request: Request,
        skip: Iterable[str] = (),
        until: str | None = None,
        observe: Callable[[str, Candidates], None] | None = None,
        snapshot: PipelineSnapshot | None = None,
    ) -> PipelineResult:
        """Answer ``request``; ``skip`` names stages to bypass, ``until`` stops after that stage.

        ``observe(stage_name, candidates)`` is called after every stage with what it handed on
        (the evaluator uses it to measure each stage's ranking and candidate recall).
        ``snapshot``: the stages to run, when the caller pinned them already (to key a cache by
        their versions); else they are pinned here, once.
        """
        snap = snapshot if snapshot is not None else self.snapshot()
        skip = set(skip)
        if request.deadline is None and self.request_budget_ms is not None:
            request = dataclasses.replace(request, deadline=time.monotonic() + self.request_budget_ms / 1000)
        cands = Candidates.empty()
        traces: list[StageTrace] = []
        tails: list[tuple[str, np.ndarray]] = []  # what each ranking stage's depth cut off, for backfill
        removed: set[int] = set()  # items a policy stage removed: backfill never offers them again
        for spec, stage in snap.stages:
            if not spec.enabled or spec.name in skip:
                why = "disabled" if not spec.enabled else "skipped by request policy"
                traces.append(StageTrace(spec.name, "skipped", 0.0, len(cands), len(cands), why))
            else:
                before = cands.items
                cands = self._run_stage(spec, stage, request, cands, traces, tails)
                if spec.kind in POLICY_KINDS:  # what it kept may still be cut by a later depth: a tail, not removed
                    removed.update(before[~np.isin(before, cands.items)].tolist())
            if observe is not None:
                observe(spec.name, cands)
            if until is not None and spec.name == until:
                return PipelineResult(candidates=cands.head(request.k), traces=traces, versions=dict(snap.versions))
        final = cands.head(request.k)
        short_reason = ""
        if len(final) < request.k:
            final, short_reason = self._backfill(request, final, tails, skip, traces, removed, snap.stages)
        short_by = request.k - len(final)
        return PipelineResult(candidates=final, traces=traces, versions=dict(snap.versions), short_by=short_by,
                              short_reason=short_reason if short_by else "")

    def _backfill(
        self, request: Request, served: Candidates, tails: list[tuple[str, np.ndarray]], skip: set[str],
        traces: list[StageTrace], removed: set[int], stages: Sequence[tuple[StageSpec, Stage]] = (),
    ) -> tuple[Candidates, str]:
        """Fill a list the policy stages left short: reach deeper, best source first.

        Sources, in order: what the later stages' depths cut off (e.g. with the LLM on, coarse's
        candidates 21-50, then coarse's past 50, in coarse order), then every stage's ``more``
        (the recall popularity channel), in blocks. Each block goes behind the served items through every
        policy stage (rules filters, then caps, counting the served items first), so a
        backfilled item obeys the same rules. Stops at ``request.k``, when the sources run out,
        or at the request deadline. Backfilled items carry ``flags["backfill"]`` and no score
        in the served order's column (they were never ranked by it). The reason a list stays
        short says whether a rule removed anything on the way (main run or backfill).
        """
        stages = stages or self.stages
        policies = [(spec, st) for spec, st in stages
                    if spec.enabled and spec.name not in skip and spec.kind in POLICY_KINDS]
        t0 = time.perf_counter()
        blocks = _backfill_blocks(request, tails, stages, skip)
        seen = set(served.items.tolist()) | set(np.asarray(request.excluded).tolist()) | removed
        ruled_out = bool(removed)  # a policy stage removed something in the main run
        out, reason = served, ""
        for items in blocks:
            if request.remaining_s() <= 0:
                reason = "request deadline reached while backfilling"
                break
            fresh = np.asarray([i for i in items.tolist() if i not in seen], dtype=np.int64)
            if not len(fresh):
                continue
            seen.update(fresh.tolist())
            trial = _append(out, fresh)
            for _spec, stage in policies:
                trial = stage.run(request, trial)
            ruled_out |= len(trial) < len(out) + len(fresh)
            out = trial.head(request.k)
            if len(out) >= request.k:
                break
        traces.append(StageTrace("backfill", "ok", (time.perf_counter() - t0) * 1000, len(served), len(out),
                                 f"{len(out) - len(served)} items added from deeper candidates"))
        if len(out) >= request.k:
            return out, ""
        return out, reason or (SHORT_RULES if ruled_out else SHORT_EXHAUSTED)

    def _run_stage(
        self, spec: StageSpec, stage: Stage, request: Request, cands: Candidates, traces: list[StageTrace],
        tails: list[tuple[str, np.ndarray]] | None = None,
    ) -> Candidates:
        n_in = len(cands)
        if request.remaining_s() <= 0:
            return self._fallback(spec, cands, traces, 0.0, "request deadline passed before the stage", tails)
        stage_request = request
        if spec.budget_ms is not None:
            stage_deadline = time.monotonic() + spec.budget_ms / 1000
            if request.deadline is not None:
                stage_deadline = min(stage_deadline, request.deadline)
            stage_request = dataclasses.replace(request, deadline=stage_deadline)
        t0 = time.perf_counter()
        try:
            if spec.on_error == "passthrough" and spec.budget_ms is not None:
                out = self.watchdog.run(spec.name, stage, stage_request, cands)
            else:
                out = stage.run(stage_request, cands)
        except StageAbandoned as exc:
            ms = (time.perf_counter() - t0) * 1000
            log.error("stage %s abandoned for request %s: %s", spec.name, request.request_id, exc)
            return self._fallback(spec, cands, traces, ms, str(exc), tails)
        except Exception as exc:  # any stage failure is contained here, by design
            ms = (time.perf_counter() - t0) * 1000
            log.warning("stage %s failed for request %s: %r", spec.name, request.request_id, exc)
            return self._fallback(spec, cands, traces, ms, f"{type(exc).__name__}: {exc}", tails)
        ms = (time.perf_counter() - t0) * 1000
        reason = ""
        if spec.budget_ms is not None and ms > spec.budget_ms:
            reason = f"budget overrun ({ms:.0f} ms > {spec.budget_ms:.0f} ms)"
            if spec.on_error == "passthrough":
                return self._fallback(spec, cands, traces, ms, reason, tails)
            # a required stage (recall, rules) has no safe previous order: a late answer beats none
        if tails is not None:
            _keep_tail(tails, spec, cands, out)
        if spec.depth is not None:
            out = out.head(spec.depth)
        traces.append(StageTrace(spec.name, "ok", ms, n_in, len(out), reason))
        return out

    @staticmethod
    def _fallback(
        spec: StageSpec, cands: Candidates, traces: list[StageTrace], ms: float, reason: str,
        tails: list[tuple[str, np.ndarray]] | None = None,
    ) -> Candidates:
        if spec.on_error == "fail":
            traces.append(StageTrace(spec.name, "error", ms, len(cands), 0, reason))
            raise PipelineError(spec.name, reason, traces)
        if tails is not None:
            _keep_tail(tails, spec, cands, cands)  # the previous order, cut at this stage's depth
        out = cands.head(spec.depth) if spec.depth is not None else cands
        traces.append(StageTrace(spec.name, "fallback", ms, len(cands), len(out), reason))
        return out


class PipelineStage:
    """A (loaded) pipeline used as one candidate stage, e.g. recall + coarse feeding LLM training.

    ``run`` returns everything the last stage handed on, not cut to ``request.k``. It is an offline
    tool, so the pipeline runs without its budgets (``Pipeline.without_budgets``).
    """

    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()

    def __init__(self, pipeline: Pipeline, name: str = "cascade"):
        self.pipeline = pipeline.without_budgets()
        self.name = name

    def load(self, artifact_dir: object) -> None:
        """Nothing to do: the wrapped pipeline's stages are loaded by whoever built it."""

    def version(self) -> str:
        return "+".join(f"{k}:{v}" for k, v in self.pipeline.versions().items())

    def run(self, request: Request, candidates: Candidates) -> Candidates:
        last: list[Candidates] = [candidates]
        self.pipeline.run(request, observe=lambda _name, c: last.append(c))
        return last[-1]


BACKFILL_BLOCK = 256  # items per backfill block from a stage's ``more`` (popularity); rules run per block
SHORT_RULES = "no more candidates pass the rules"
SHORT_EXHAUSTED = "no more candidates: every item the stages can reach is already listed, in the history or excluded"


def _keep_tail(tails: list[tuple[str, np.ndarray]], spec: StageSpec, given: Candidates, out: Candidates) -> None:
    """Record what ranking stage ``spec``'s depth cuts off ``out`` (the module doc's tail): ``out``
    past the depth, then the items of ``given`` that ``out`` does not hold, in ``given``'s order.
    A policy stage records none: what it removed is never backfilled.

    >>> tails = []
    >>> _keep_tail(tails, StageSpec(name="llm", kind="llm", depth=2),
    ...            Candidates(items=np.array([5, 6, 7, 8])), Candidates(items=np.array([6, 5, 7])))
    >>> [(name, t.tolist()) for name, t in tails]
    [('llm', [7, 8])]
    """
    if spec.kind in POLICY_KINDS:
        return
    past = out.items[spec.depth:] if spec.depth is not None else out.items[:0]
    dropped = given.items[~np.isin(given.items, out.items)]
    tail = np.concatenate([past, dropped]).astype(np.int64)
    if len(tail):
        tails.append((spec.name, tail))


def _backfill_blocks(
    request: Request, tails: list[tuple[str, np.ndarray]], stages: Sequence[tuple[StageSpec, Stage]], skip: set[str],
) -> Iterator[np.ndarray]:
    """Item-index blocks for ``Pipeline._backfill``: the latest stage's cut-off first, then ``more``."""
    for _name, tail in reversed(tails):
        yield tail
    for spec, stage in stages:
        if spec.enabled and spec.name not in skip and isinstance(stage, Backfilling):
            for block in stage.more(request, BACKFILL_BLOCK):
                yield np.asarray(block, dtype=np.int64)


def _append(served: Candidates, items: np.ndarray) -> Candidates:
    """``served`` followed by ``items`` (no scores: NaN in every column), flagged ``backfill``."""
    n = len(items)
    nan = np.full(n, np.nan, dtype=np.float32)
    flags = {k: np.concatenate([v, np.zeros(n, dtype=bool)]) for k, v in served.flags.items()}
    old = served.flags.get("backfill", np.zeros(len(served), dtype=bool))
    flags["backfill"] = np.concatenate([old, np.ones(n, dtype=bool)])
    return Candidates(
        items=np.concatenate([served.items, items]),
        scores={k: np.concatenate([v, nan]) for k, v in served.scores.items()},
        flags=flags, order_by=served.order_by,
        disclaimers={k: list(v) for k, v in served.disclaimers.items()}, removed=list(served.removed),
    )
