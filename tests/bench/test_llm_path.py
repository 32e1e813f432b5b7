"""The LLM path's precision rows and forward floor: settings per precision, refusals, the floor on a tiny model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from bench.llm_path import at_precision, bench_llm_precisions, forward_floor, popular_cases
from bench.serving import bench_serve
from cascade.settings import Settings
from cli.main import app
from recsys.config import StageSpec
from recsys.contract import Request
from tests.llm_rerank.factories import save_tiny_llm, tiny_split
from tests.serving.toy import toy_settings

RECALL = StageSpec(name="recall", kind="recall", on_error="fail")
LLM = StageSpec(name="llm", kind="llm", on_error="passthrough", budget_ms=5000, params={"candidates": 8})


def test_at_precision_sets_the_llm_section_and_every_llm_stage() -> None:
    settings = at_precision(toy_settings(RECALL, LLM), "int8", Path("/w8a8"))
    assert settings.llm.precision == "int8" and settings.llm.int8_dir == Path("/w8a8")
    llm = next(s for s in settings.pipeline.stages if s.kind == "llm")
    assert llm.params == {"candidates": 8, "precision": "int8", "int8_dir": "/w8a8"}
    assert next(s for s in settings.pipeline.stages if s.kind == "recall").params == {}
    assert settings.llm.with_overrides(dict(llm.params)).precision == "int8"
    assert at_precision(toy_settings(RECALL, LLM), "bf16").llm.int8_dir is None


def test_precisions_are_refused_without_an_llm_stage_or_when_unknown(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="llm_precisions"):  # before any server starts
        bench_serve(toy_settings(), tmp_path, ["u1"], ["m1"], llm_precisions=("bf16",))
    with pytest.raises(ValueError, match="precisions among"):
        bench_llm_precisions(toy_settings(RECALL, LLM), tmp_path, ["u1"], ["fp16"], (1,), 1, work_dir=tmp_path)


@pytest.mark.parametrize("value", ["fp16", "bf16,bf16"])
def test_cli_refuses_bad_precisions_in_one_line(value: str) -> None:
    res = CliRunner().invoke(app, ["bench", "serve", "--llm-precisions", value])
    assert res.exit_code == 2 and "--llm-precisions takes fp32, bf16, int8" in res.output
    assert "Traceback" not in res.output


def test_forward_floor_times_each_warm_prompt_and_its_uncached_tail(tmp_path: Path) -> None:
    save_tiny_llm(tmp_path / "tiny-llm")
    tiny_split().save(tmp_path / "toy" / "split")
    settings = Settings.build({"artifacts_dir": str(tmp_path), "llm": {
        "model": str(tmp_path / "tiny-llm"), "precision": "fp32", "candidates": 4, "kv": {"block_tokens": 8}}})
    cases = [(Request(user_id=f"u{u}", history=np.array([u, u + 1]), user_attrs={"age": 30}), np.arange(4) + u, 0)
             for u in range(3)]
    floor = forward_floor(settings, tmp_path / "toy", cases, repeats=2)
    assert floor["requests"] == 3 and floor["stage_ms"]["n"] == floor["floor_ms"]["n"] == 6
    assert 1 <= floor["tail_tokens_mean"] <= 8 < floor["prompt_tokens_mean"]  # the last, partial block runs
    assert floor["floor_ms"]["p50_ms"] > 0 and floor["threads"] >= 1
    pointwise = Settings.build({**settings.model_dump(mode="json"), "llm": {**settings.llm.model_dump(mode="json"),
                                                                            "scoring": "pointwise"}})
    assert "skipped" in forward_floor(pointwise, tmp_path / "toy", cases)


def test_popular_cases_are_unseen_popular_items_of_distinct_validation_users() -> None:
    split = tiny_split()
    cases = popular_cases(split, 3, 4, seed=0)
    assert len({request.user_id for request, _, _ in cases}) == 3
    by_pop = np.argsort(-split.item_popularity("valid"), kind="stable")
    for request, items, target in cases:
        assert len(items) == 4 and not np.isin(items, request.history).any()
        assert list(items) == [i for i in by_pop if i not in set(request.history)][:4]
        assert target == split.targets("valid")[split.vocab.user_index[request.user_id]]
