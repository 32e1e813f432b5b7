"""SmoothQuant W8A8 on tiny random models of every packaged backbone architecture (Llama/SmolLM2, Qwen2,
Gemma 3): folding is exact, int8 scores stay close to fp32, the int8 model loads from its calibration."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from cascade.settings import Settings
from llm_rerank.backbone import load_model
from llm_rerank.forward import LogitScorer, listwise_from_logits, pointwise_from_logits
from llm_rerank.prompt import PromptBuilder
from llm_rerank.quant import METHOD, W8A8Linear, calibrate, load_w8a8, mlp_input_norm, save_calibrated
from llm_rerank.stage import LLMRerankStage
from recsys.config import StageSpec
from recsys.contract import Request
from tests.llm_rerank.factories import ANIMATION, ARCHITECTURES, HORROR, tiny_llm, tiny_split


def test_w8a8_linear_matches_float_within_int8_error() -> None:
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 32)
    x = torch.randn(5, 64)
    q = W8A8Linear.from_linear(lin)
    assert q.qweight_t.dtype == torch.int8 and q.qweight_t.shape == (64, 32)
    ref = lin(x)
    err = (q(x) - ref).abs().max() / ref.abs().max()
    assert 0 < err < 0.02  # really quantised, and within int8 rounding
    assert q(x.bfloat16()).dtype == torch.bfloat16


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_calibrated_model_is_equivalent_in_fp32_and_loads_as_int8(tmp_path: Path, arch: str) -> None:
    model, tok = tiny_llm(arch=arch)
    builder = PromptBuilder(tok)
    prompts = [builder.listwise(HORROR[:3], {"age": 30}, ANIMATION).prefix,
               builder.listwise(ANIMATION[:2], {}, HORROR[:4]).prefix]
    ids = torch.tensor([prompts[0]])
    with torch.inference_mode():
        before = model(input_ids=ids).logits
    layer = model.model.layers[0]
    norms_before = [layer.input_layernorm.weight.clone(), mlp_input_norm(layer).weight.clone()]
    record = calibrate(model, prompts, alpha=0.5)
    with torch.inference_mode():
        after = model(input_ids=ids).logits
    # factors were folded into both norms that feed projections (Gemma 3: the pre-feedforward one) ...
    assert not torch.equal(norms_before[0], layer.input_layernorm.weight)
    assert not torch.equal(norms_before[1], mlp_input_norm(layer).weight)
    assert torch.allclose(before, after, atol=1e-3 * before.abs().max())  # ... without changing the function
    out = save_calibrated(model, tok, record, tmp_path / "w8a8", source="tiny")
    saved = json.loads((out / "calibration.json").read_text())
    assert saved["method"] == METHOD and saved["alpha"] == 0.5 and saved["prompts"] == 2

    qmodel, _ = load_model(str(out), "int8")
    from llm_rerank.quant import FusedSlice

    linears = [m for m in qmodel.modules() if isinstance(m, W8A8Linear | FusedSlice)]
    assert len(linears) == len(qmodel.model.layers) * 7  # q k v o gate up down in each layer
    assert qmodel.model.embed_tokens.weight.dtype == torch.float32  # the non-int8 rest stays fp32 by default
    assert load_w8a8(str(out), rest_dtype="bf16")[0].model.embed_tokens.weight.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="rest_dtype"):
        load_w8a8(str(out), rest_dtype="fp16")
    with torch.inference_mode():
        qlogits = qmodel(input_ids=ids).logits.float()[0, -1]
    ref = before[0, -1]
    assert torch.corrcoef(torch.stack([qlogits, ref]))[0, 1] > 0.95

    with pytest.raises(FileNotFoundError, match="calibration.json"):
        load_model(str(tmp_path / "nowhere"), "int8")


def test_gemma_norm_folding_respects_its_unit_offset() -> None:
    """Gemma's RMSNorm scales by 1 + w: dividing w alone by s would change the function."""
    model, _ = tiny_llm(arch="gemma3")
    norm = model.model.layers[0].input_layernorm
    x = torch.randn(3, norm.weight.shape[0])
    s = torch.linspace(0.5, 2.0, norm.weight.shape[0])
    expected = norm(x) / s
    from llm_rerank.quant import _fold_into_norm

    with torch.no_grad():
        _fold_into_norm(norm, s)
    torch.testing.assert_close(norm(x), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_int8_scores_stay_close_to_fp32(arch: str) -> None:
    """Listwise and pointwise scores of the W8A8 model against the fp32 model they came from, over
    requests of shuffled histories and candidates: a random tiny model's scores are nearly flat, so
    one 9-letter request's correlation swings with the prompt's wording, while the mean over
    requests measures the quantization. Scores rank one request's candidates, so the error is
    measured after removing the shift common to all of them."""
    from llm_rerank.quant import quantize_w8a8

    model, tok = tiny_llm(arch=arch)
    builder = PromptBuilder(tok)
    rng = np.random.default_rng(0)
    shuffled = [list(rng.permutation(ANIMATION + HORROR)) for _ in range(8)]
    requests = [builder.listwise(s[:3], {"age": 20 + 5 * k} if k % 2 else {}, s[3:]) for k, s in enumerate(shuffled)]
    pointwise = [builder.pointwise(s[:4], {"age": 30}, s[4:10]) for s in shuffled[:3]]
    scorer = LogitScorer(model, tok.pad_token_id)

    def scores() -> list[np.ndarray]:
        lists = [listwise_from_logits(scorer.logits(p, use_cache=False), builder.letter_ids, 9) for p in requests]
        return [*lists, *(pointwise_from_logits(scorer.logits(p), *builder.yes_no) for p in pointwise)]

    reference = scores()
    calibrate(model, [builder.listwise(ANIMATION[:3], {}, HORROR).prefix], alpha=0.5)
    assert quantize_w8a8(model) == len(model.model.layers) * 7
    correlations = []
    for got, ref in zip(scores(), reference, strict=True):
        assert not np.array_equal(got, ref)  # really int8 numbers
        shift = np.mean(got - ref)  # common to every candidate of a request: moves no candidate past another
        assert np.abs(got - ref - shift).max() < 0.25 * np.ptp(ref)
        correlations.append(np.corrcoef(got, ref)[0, 1])
    assert min(correlations) > 0.95 and np.mean(correlations) > 0.98, correlations


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_stage_serves_int8_from_the_calibrated_directory(tmp_path: Path, arch: str) -> None:
    model, tok = tiny_llm(arch=arch)
    builder = PromptBuilder(tok)
    save_calibrated(model, tok, calibrate(model, [builder.prefix(HORROR[:3], {})]), tmp_path / "q")
    tiny_split().save(tmp_path / "toy" / "split")
    settings = Settings.build({"llm": {"precision": "int8", "int8_dir": str(tmp_path / "q"), "candidates": 4}})
    stage = LLMRerankStage(StageSpec(name="llm", kind="llm"), settings.llm,
                           artifacts_root=settings.artifacts_dir)
    stage.load(tmp_path / "toy")
    assert stage.model_location == str(tmp_path / "q")
    scores = stage.score(Request(user_id="u0", history=np.array([6, 7])), np.array([0, 1, 6, 7]))
    assert scores.shape == (4,) and np.isfinite(scores).all()
    assert np.exp(scores).sum() == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_projections_reading_one_input_share_its_quantisation(arch: str) -> None:
    from llm_rerank.quant import quantize_w8a8

    model, _ = tiny_llm(arch=arch)
    assert quantize_w8a8(model, fuse=False) == len(model.model.layers) * 7
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert attn.q_proj.quant is attn.k_proj.quant is attn.v_proj.quant
    assert mlp.gate_proj.quant is mlp.up_proj.quant and mlp.down_proj.quant is not mlp.up_proj.quant
    assert attn.v_proj.release and not attn.q_proj.release  # the last reader frees the cached activation
    with torch.inference_mode():
        model(input_ids=torch.tensor([[1, 2, 3]]))
    assert attn.q_proj.quant._value is None and mlp.gate_proj.quant._value is None  # nothing held afterwards


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_fused_projections_equal_separate_int8_ones_and_hold_nothing_after(arch: str) -> None:
    from llm_rerank.quant import FusedSlice, quantize_w8a8

    model, _ = tiny_llm(arch=arch)
    separate, _ = tiny_llm(arch=arch)
    separate.load_state_dict(model.state_dict())
    n = len(model.model.layers) * 7
    assert quantize_w8a8(model) == n and quantize_w8a8(separate, fuse=False) == n
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert all(isinstance(m, FusedSlice) for m in (attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj))
    assert attn.q_proj.group[0] is attn.v_proj.group[0] and isinstance(attn.o_proj, W8A8Linear)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.inference_mode():
        fused, ref = model(input_ids=ids).logits, separate(input_ids=ids).logits
    torch.testing.assert_close(fused, ref, rtol=0, atol=1e-5)  # same int8 numbers, one GEMM
    assert attn.q_proj.group[0]._y is None and mlp.up_proj.group[0]._y is None
