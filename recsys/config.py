"""Pipeline configuration: which stages run, in which order, at which depth and budget.

The pipeline YAML (``configs/pipeline.yaml``) has a ``pipeline:`` section that validates into
``PipelineConfig``; the other top-level keys are the per-package configs bundled by
``cascade.settings.Settings``. ``KINDS`` names the stage kinds a spec may ask for; the class
behind each kind is ``cascade.registry.STAGE_KINDS`` (above the stages, which this core never
imports), and which settings section each kind is built with is ``cascade.registry.STAGE_SECTIONS``.

Default cascade depths follow industry practice and the LlamaRec setup:
recall 200 -> coarse 50 -> LLM 20 -> final 10.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# the stage kinds a spec may name; cascade.registry.STAGE_KINDS gives the class of each
KINDS: tuple[str, ...] = ("recall", "coarse", "llm", "rules", "fusion", "recall_llm", "rules_tagged")

# Policy stages decide what may be served (they remove items, never rank): the pipeline runs
# deeper candidates through them when they leave a list short (``recsys.pipeline``).
POLICY_KINDS: frozenset[str] = frozenset({"rules", "rules_tagged"})

# The name a stage of these kinds must carry: fusion, training, the LLM's candidate source and
# the evaluator read its score column and its trained artifacts by that name.
FIXED_NAMES: dict[str, str] = {"recall": "recall", "recall_llm": "recall", "coarse": "coarse", "llm": "llm"}
# The longest budget a stage or request may have (one day): "no limit" written as a huge number
# would overflow the watchdog's wait and make the stage fall back on every request.
MAX_BUDGET_MS = 86_400_000.0


class StageSpec(BaseModel):
    """One stage of the pipeline as configured."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="Stage name; also the score column it writes.", min_length=1)
    kind: str = Field(description=f"Stage implementation, one of {sorted(KINDS)}.")
    depth: int | None = Field(None, ge=1, le=100_000, description="Candidates kept after this stage.")
    budget_ms: float | None = Field(None, gt=0, le=MAX_BUDGET_MS,
                                    description="Time budget (ms, at most a day); an overrun triggers the fallback.")
    enabled: bool = Field(True, description="A disabled stage is skipped and reported as such.")
    on_error: Literal["passthrough", "fail"] = Field(
        "passthrough",
        description="passthrough: on error/overrun keep the previous order (fallback); fail: the request fails.",
    )
    params: dict[str, Any] = Field(default_factory=dict, description="Stage-specific overrides.")

    @model_validator(mode="after")
    def _known_kind(self) -> StageSpec:
        if self.kind not in KINDS:
            raise ValueError(f"unknown stage kind {self.kind!r}; known kinds: {sorted(KINDS)}")
        return self


def default_stages() -> list[StageSpec]:
    return [
        StageSpec(name="recall", kind="recall", depth=200, budget_ms=200, on_error="fail"),
        StageSpec(name="coarse", kind="coarse", depth=50, budget_ms=200),
        StageSpec(name="llm", kind="llm", depth=20, budget_ms=3000, enabled=False),
        StageSpec(name="rules", kind="rules", on_error="fail", params={"apply": "filters"}),
        StageSpec(name="fusion", kind="fusion"),
        StageSpec(name="caps", kind="rules", on_error="fail", params={"apply": "caps"}),
    ]


class PipelineConfig(BaseModel):
    """The ordered stage list plus request-level limits."""

    model_config = ConfigDict(extra="forbid")

    stages: list[StageSpec] = Field(default_factory=default_stages)
    request_budget_ms: float = Field(5000.0, gt=0, le=MAX_BUDGET_MS, description="Whole-request deadline (ms, at "
                                     "most a day).")
    max_k: int = Field(100, ge=1, le=1000, description="Largest k a request may ask for.")

    @model_validator(mode="after")
    def _check_stages(self) -> PipelineConfig:
        if not self.stages:
            raise ValueError("pipeline.stages is empty; at least a recall stage is needed")
        names = [s.name for s in self.stages]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"pipeline.stages: duplicate stage names {dup}")
        first = self.stages[0]
        if first.kind != "recall":
            raise ValueError(f"pipeline.stages[0] must be a recall stage, got kind {first.kind!r}")
        if first.on_error == "passthrough":
            raise ValueError("pipeline.stages[0] (recall) cannot use on_error=passthrough: it has no previous order")
        if not first.enabled:
            raise ValueError("pipeline.stages[0] (recall) cannot be disabled: every later stage ranks its candidates")
        for i, s in enumerate(self.stages):
            if (want := FIXED_NAMES.get(s.kind)) is not None and s.name != want:
                raise ValueError(f"pipeline.stages[{i}]: a {s.kind} stage must be named {want!r} (fusion, training "
                                 f"and the evaluator read its scores and artifacts by that name), got {s.name!r}")
        last_depth: int | None = None
        for i, s in enumerate(self.stages):
            if s.depth is None or not s.enabled:
                continue
            if last_depth is not None and s.depth > last_depth:
                raise ValueError(
                    f"pipeline.stages[{i}] ({s.name}): depth {s.depth} exceeds the previous stage depth {last_depth}"
                )
            last_depth = s.depth
        return self

    def stage(self, name: str) -> StageSpec:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(f"no stage named {name!r} in pipeline (have {[s.name for s in self.stages]})")
