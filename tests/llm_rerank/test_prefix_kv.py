"""Two-tier block prefix cache on tiny random models of every packaged backbone architecture (Llama/SmolLM2,
Qwen2, Gemma 3 with a sliding window shorter than the prompts): cached == uncached, tiers, serialisation."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis
import torch

from cascade.registry import stage_context
from cascade.settings import Settings
from llm_rerank.forward import LogitScorer, pointwise_from_logits
from llm_rerank.prefix_kv import BlockPrefixCache, decode_block, encode_block
from llm_rerank.prompt import PromptBuilder
from llm_rerank.stage import LLMRerankStage
from recsys.config import StageSpec
from recsys.contract import Request
from recsys.redis_server import EmbeddedRedis
from tests.llm_rerank.factories import (
    ANIMATION,
    ARCHITECTURES,
    HORROR,
    TINY_SLIDING_WINDOW,
    save_tiny_llm,
    tiny_llm,
    tiny_split,
)

ATTRS = {"age": 30, "gender": "F"}


@pytest.fixture(scope="module")
def embedded() -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis()
    server.start()
    yield server
    server.stop()


def test_block_codec_round_trips_exactly() -> None:
    block = torch.randn(2, 2, 3, 4, 5)
    assert torch.equal(decode_block(encode_block(block)), block)
    bf = block.bfloat16()
    raw = encode_block(bf)
    assert len(raw) == 16 + bf.numel() * 2  # header + 2 bytes per value
    assert torch.equal(decode_block(raw), bf)
    assert decode_block(encode_block(block, torch.float16), torch.float32).dtype == torch.float32
    with pytest.raises(ValueError, match="5-d"):
        encode_block(torch.zeros(3))


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_cold_warm_and_tier2_scores_equal_uncached(embedded: EmbeddedRedis, arch: str) -> None:
    model, tok = tiny_llm(arch=arch)
    builder = PromptBuilder(tok)
    client = redis.Redis.from_url(embedded.url)
    blocks = BlockPrefixCache.build(model, block_tokens=16, namespace=f"t1-{arch}", redis_client=client,
                                    prefix=f"pk-{arch}:")
    cached = LogitScorer(model, tok.pad_token_id, batch_size=3, blocks=blocks)
    plain = LogitScorer(model, tok.pad_token_id, batch_size=3)
    parts = builder.pointwise(HORROR[:4], ATTRS, ANIMATION[:5])
    reference = plain.logits(parts, use_cache=False)
    assert len(parts.prefix) > 4 * TINY_SLIDING_WINDOW  # Gemma 3's sliding layers see only part of it
    cold = cached.logits(parts)
    n_blocks = len(parts.prefix) // 16
    assert blocks.stats()["stored"] == n_blocks > 3
    warm = cached.logits(parts)
    assert blocks.stats()["tier1_hits"] == n_blocks
    blocks.cache.clear_tier1()  # a restarted / other worker: only Redis has the blocks
    tier2 = cached.logits(parts)
    assert blocks.stats()["tier2_hits"] == n_blocks
    yes, no = builder.yes_no
    ref_p = pointwise_from_logits(reference, yes, no)
    for got in (cold, warm, tier2):
        assert torch.allclose(got, reference, atol=1e-4)
        np.testing.assert_allclose(pointwise_from_logits(got, yes, no), ref_p, atol=1e-5)
    # another user: the instruction blocks are shared, the history blocks are not
    other = builder.pointwise(ANIMATION[:4], ATTRS, ANIMATION[:2])
    before = blocks.stats()["tier1_hits"]
    assert torch.allclose(cached.logits(other), plain.logits(other, use_cache=False), atol=1e-4)
    shared = blocks.stats()["tier1_hits"] - before
    assert 1 <= shared < n_blocks


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_stage_with_block_cache_survives_redis_loss(tmp_path: Path, arch: str) -> None:
    save_tiny_llm(tmp_path / "m", arch=arch)
    tiny_split().save(tmp_path / "toy" / "split")
    server = EmbeddedRedis(tmp_path / "redis")
    url = server.start()
    try:
        def stage(kv: bool) -> LLMRerankStage:
            settings = Settings.build({"artifacts_dir": str(tmp_path), "llm": {
                "model": str(tmp_path / "m"), "precision": "fp32", "scoring": "pointwise", "candidates": 4,
                "kv": {"enabled": kv, "tier2": kv, "tier2_url": url, "block_tokens": 8}}})
            s = LLMRerankStage(StageSpec(name="llm", kind="llm"), settings.llm,
                               **stage_context("llm", settings))  # tier 2: a client of kv.tier2_url
            s.load(tmp_path / "toy")
            return s

        cached, plain = stage(True), stage(False)
        request = Request(user_id="u0", history=np.array([6, 7, 8]), user_attrs=ATTRS)
        items = np.array([0, 1, 2, 3])
        expected = plain.score(request, items)
        np.testing.assert_allclose(cached.score(request, items), expected, atol=1e-5)
        restarted = stage(True)  # a new process: empty tier 1, same Redis
        np.testing.assert_allclose(restarted.score(request, items), expected, atol=1e-5)
        assert restarted.cache_stats()["kv_tier2_hits"] > 0
        server.stop()
        np.testing.assert_allclose(stage(True).score(request, items), expected, atol=1e-5)  # recomputed
    finally:
        server.stop()


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_listwise_row_is_block_cached_whole_and_a_repeat_recomputes_only_its_tail(arch: str) -> None:
    model, tok = tiny_llm(arch=arch)
    builder = PromptBuilder(tok)
    blocks = BlockPrefixCache.build(model, block_tokens=8, namespace="lw")
    cached = LogitScorer(model, tok.pad_token_id, blocks=blocks)
    parts = builder.listwise(HORROR[:3], ATTRS, ANIMATION)
    reference = LogitScorer(model, tok.pad_token_id).logits(parts, use_cache=False)
    row = len(parts.prefix) + len(parts.suffixes[0])
    assert torch.allclose(cached.logits(parts), reference, atol=1e-4)
    assert blocks.stats()["stored"] == (row - 1) // 8  # candidates included, not only the prefix
    passes: list[int] = []  # tokens per forward pass
    hook = model.get_input_embeddings().register_forward_hook(lambda _m, args, _out: passes.append(args[0].shape[1]))
    try:
        assert torch.allclose(cached.logits(parts), reference, atol=1e-4)
    finally:
        hook.remove()
    assert blocks.stats()["tier1_hits"] == (row - 1) // 8 and blocks.stats()["stored"] == (row - 1) // 8
    assert passes == [row - (row - 1) // 8 * 8]  # one pass: the tokens after the cached blocks, the last included


def test_gemma3_sliding_window_really_cuts_the_test_prompts() -> None:
    """The cached == uncached checks above prove something for sliding layers only if the window
    changes the answer: the same weights with a window longer than the prompt score differently."""
    model, tok = tiny_llm(arch="gemma3")
    wide, _ = tiny_llm(arch="gemma3")
    wide.load_state_dict(model.state_dict())
    wide.config.sliding_window = 4096
    for layer in wide.model.layers:
        layer.self_attn.sliding_window = None if layer.self_attn.sliding_window is None else 4096
    parts = PromptBuilder(tok).listwise(HORROR[:3], ATTRS, ANIMATION)
    windowed = LogitScorer(model, tok.pad_token_id).logits(parts, use_cache=False)
    unwindowed = LogitScorer(wide, tok.pad_token_id).logits(parts, use_cache=False)
    assert (windowed - unwindowed).abs().max() > 1e-2


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_lm_head_runs_only_at_scoring_positions(arch: str) -> None:
    """Gemma 3's 262k vocabulary makes the LM head the largest matmul: prefix passes keep one
    position, suffix passes only the answer positions (``logits_to_keep``), never the full sequence."""
    model, tok = tiny_llm(arch=arch)
    builder = PromptBuilder(tok)
    rows: list[int] = []
    hook = model.get_output_embeddings().register_forward_hook(
        lambda _m, args, _out: rows.append(args[0].reshape(-1, args[0].shape[-1]).shape[0]))
    try:
        parts = builder.pointwise(HORROR[:3], ATTRS, ANIMATION[:5])
        LogitScorer(model, tok.pad_token_id, batch_size=5).logits(parts)
        # the prefix pass, then per candidate row the positions where some row of the batch ends
        assert rows == [1, 5 * len({len(suffix) for suffix in parts.suffixes})]
        rows.clear()
        blocks = BlockPrefixCache.build(model, block_tokens=8, namespace="head")
        LogitScorer(model, tok.pad_token_id, blocks=blocks).logits(builder.listwise(HORROR[:3], ATTRS, ANIMATION))
        assert rows == [1]  # one pass over the row's uncached tokens, logits at its last one only
    finally:
        hook.remove()
