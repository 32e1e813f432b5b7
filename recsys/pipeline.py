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

Each stage sees the request with ``deadline`` set to the tighter of the request deadline
and its own budget, so a stage that can stop early (the LLM) knows when to.

Deliberately left out: building stages from config (``recsys.registry``) and HTTP.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from recsys.config import StageSpec
from recsys.contract import Candidates, Request, Stage, StageTrace

log = logging.getLogger(__name__)


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

    @property
    def fallbacks(self) -> list[str]:
        return [t.name for t in self.traces if t.status == "fallback"]

    @property
    def ran(self) -> list[str]:
        return [t.name for t in self.traces if t.status == "ok"]

    @property
    def total_ms(self) -> float:
        return sum(t.ms for t in self.traces)


class Pipeline:
    """An ordered list of (spec, stage) pairs; built by ``recsys.registry.build_pipeline``."""

    def __init__(self, stages: Sequence[tuple[StageSpec, Stage]], request_budget_ms: float | None = None):
        self.stages = list(stages)
        self.request_budget_ms = request_budget_ms

    def stage(self, name: str) -> Stage:
        for spec, stage in self.stages:
            if spec.name == name:
                return stage
        raise KeyError(f"no stage named {name!r}")

    def versions(self) -> dict[str, str]:
        return {spec.name: stage.version() for spec, stage in self.stages if spec.enabled}

    def run(
        self,
        request: Request,
        skip: Iterable[str] = (),
        until: str | None = None,
        observe: Callable[[str, Candidates], None] | None = None,
    ) -> PipelineResult:
        """Answer ``request``; ``skip`` names stages to bypass, ``until`` stops after that stage.

        ``observe(stage_name, candidates)`` is called after every stage with what it handed on
        (the evaluator uses it to measure each stage's ranking and candidate recall).
        """
        skip = set(skip)
        if request.deadline is None and self.request_budget_ms is not None:
            request = dataclasses.replace(request, deadline=time.monotonic() + self.request_budget_ms / 1000)
        cands = Candidates.empty()
        traces: list[StageTrace] = []
        for spec, stage in self.stages:
            if not spec.enabled or spec.name in skip:
                why = "disabled" if not spec.enabled else "skipped by request policy"
                traces.append(StageTrace(spec.name, "skipped", 0.0, len(cands), len(cands), why))
            else:
                cands = self._run_stage(spec, stage, request, cands, traces)
            if observe is not None:
                observe(spec.name, cands)
            if until is not None and spec.name == until:
                break
        return PipelineResult(candidates=cands.head(request.k), traces=traces, versions=self.versions())

    def _run_stage(
        self, spec: StageSpec, stage: Stage, request: Request, cands: Candidates, traces: list[StageTrace]
    ) -> Candidates:
        n_in = len(cands)
        if request.remaining_s() <= 0:
            return self._fallback(spec, cands, traces, 0.0, "request deadline passed before the stage")
        stage_request = request
        if spec.budget_ms is not None:
            stage_deadline = time.monotonic() + spec.budget_ms / 1000
            if request.deadline is not None:
                stage_deadline = min(stage_deadline, request.deadline)
            stage_request = dataclasses.replace(request, deadline=stage_deadline)
        t0 = time.perf_counter()
        try:
            out = stage.run(stage_request, cands)
        except Exception as exc:  # any stage failure is contained here, by design
            ms = (time.perf_counter() - t0) * 1000
            log.warning("stage %s failed for request %s: %r", spec.name, request.request_id, exc)
            return self._fallback(spec, cands, traces, ms, f"{type(exc).__name__}: {exc}")
        ms = (time.perf_counter() - t0) * 1000
        reason = ""
        if spec.budget_ms is not None and ms > spec.budget_ms:
            reason = f"budget overrun ({ms:.0f} ms > {spec.budget_ms:.0f} ms)"
            if spec.on_error == "passthrough":
                return self._fallback(spec, cands, traces, ms, reason)
            # a required stage (recall, rules) has no safe previous order: a late answer beats none
        if spec.depth is not None:
            out = out.head(spec.depth)
        traces.append(StageTrace(spec.name, "ok", ms, n_in, len(out), reason))
        return out

    @staticmethod
    def _fallback(
        spec: StageSpec, cands: Candidates, traces: list[StageTrace], ms: float, reason: str
    ) -> Candidates:
        if spec.on_error == "fail":
            traces.append(StageTrace(spec.name, "error", ms, len(cands), 0, reason))
            raise PipelineError(spec.name, reason, traces)
        out = cands.head(spec.depth) if spec.depth is not None else cands
        traces.append(StageTrace(spec.name, "fallback", ms, len(cands), len(out), reason))
        return out


class PipelineStage:
    """A (loaded) pipeline used as one candidate stage, e.g. recall + coarse feeding LLM training.

    ``run`` returns everything the last stage handed on, not cut to ``request.k``.
    """

    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()

    def __init__(self, pipeline: Pipeline, name: str = "cascade"):
        self.pipeline = pipeline
        self.name = name

    def load(self, artifact_dir: object) -> None:
        """Nothing to do: the wrapped pipeline's stages are loaded by whoever built it."""

    def version(self) -> str:
        return "+".join(f"{k}:{v}" for k, v in self.pipeline.versions().items())

    def run(self, request: Request, candidates: Candidates) -> Candidates:
        last: list[Candidates] = [candidates]
        self.pipeline.run(request, observe=lambda _name, c: last.append(c))
        return last[-1]
