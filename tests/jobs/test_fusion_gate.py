"""The fusion gate's job: users whose valid item trained the LLM stay out (the gate itself: ``tests/fusion/test_train.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from jobs.fusion_gate import llm_trained_users
from recsys.config import StageSpec


def _pipeline(*stages: tuple[StageSpec, object]) -> SimpleNamespace:
    return SimpleNamespace(stages=list(stages))


def test_llm_trained_users_come_from_the_served_models_train_meta(tmp_path: Path) -> None:
    served = tmp_path / "llm"
    served.mkdir()
    (served / "train_meta.json").write_text(json.dumps({"valid_users": [3, 1, 7]}))
    llm = StageSpec(name="llm", kind="llm", depth=20)
    coarse = StageSpec(name="coarse", kind="coarse", depth=50)
    stage = SimpleNamespace(model_location=str(served))
    assert llm_trained_users(_pipeline((coarse, SimpleNamespace()), (llm, stage))) == {1, 3, 7}
    disabled = llm.model_copy(update={"enabled": False})
    assert llm_trained_users(_pipeline((disabled, stage))) == set()
    # a model trained on train positives (or a base model without train_meta) holds no one out
    (served / "train_meta.json").write_text(json.dumps({"valid_users": []}))
    assert llm_trained_users(_pipeline((llm, stage))) == set()
    assert llm_trained_users(_pipeline((llm, SimpleNamespace(model_location=str(tmp_path / "base"))))) == set()
