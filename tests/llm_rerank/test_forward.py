"""Logit scoring on a tiny random Llama: prefix cache == full prompts, verbalizer maths, LRU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from llm_rerank.forward import (
    LogitScorer,
    PrefixCache,
    listwise_from_logits,
    pointwise_from_logits,
    reserved_cache,
    row_logits,
    run_prefix,
    suffix_logits,
)
from llm_rerank.prompt import PromptBuilder
from tests.llm_rerank.factories import ANIMATION, HORROR, tiny_llm

ATTRS = {"age": 30, "gender": "M"}


@pytest.fixture(scope="module")
def tiny() -> tuple[LogitScorer, PromptBuilder]:
    model, tok = tiny_llm()
    return LogitScorer(model, tok.pad_token_id, batch_size=2, cache=PrefixCache(4)), PromptBuilder(tok)


def test_cached_prefix_matches_full_prompts(tiny: tuple[LogitScorer, PromptBuilder]) -> None:
    scorer, builder = tiny
    # titles of different token lengths, batch_size 2: right padding and batching both exercised
    parts = builder.pointwise(ANIMATION[:3], ATTRS, ["Alien (1979)", "Shining, The (1980)", "Psycho (1960)",
                                                      "A Much Longer Title For Padding (2001)", "Dumbo (1941)"])
    cached = scorer.logits(parts, use_cache=True)
    full = scorer.logits(parts, use_cache=False)
    assert cached.shape == full.shape == (5, scorer.model.config.vocab_size)
    assert torch.allclose(cached, full, atol=1e-3)
    yes, no = builder.yes_no
    cached_p, full_p = pointwise_from_logits(cached, yes, no), pointwise_from_logits(full, yes, no)
    np.testing.assert_allclose(cached_p, full_p, atol=1e-3)
    assert np.ptp(cached_p) > 1e-3  # the candidates really get different scores


def test_listwise_cached_matches_full_and_is_a_distribution(tiny: tuple[LogitScorer, PromptBuilder]) -> None:
    scorer, builder = tiny
    parts = builder.listwise(ANIMATION[:2], ATTRS, HORROR)
    cached, full = scorer.logits(parts), scorer.logits(parts, use_cache=False)
    assert torch.allclose(cached, full, atol=1e-3)
    scores = listwise_from_logits(cached, builder.letter_ids, len(HORROR))
    assert scores.shape == (6,)
    assert np.exp(scores).sum() == pytest.approx(1.0, abs=1e-5)


def test_pointwise_probability_is_yes_over_yes_plus_no() -> None:
    logits = torch.zeros(2, 5)
    logits[0, 3], logits[1, 4] = 2.0, 1.0  # row 0: yes=2 no=0; row 1: yes=0 no=1
    np.testing.assert_allclose(pointwise_from_logits(logits, 3, 4),
                               [np.exp(2) / (np.exp(2) + 1), 1 / (1 + np.e)], rtol=1e-6)


def test_prefix_cache_is_lru_and_reused_across_requests(tiny: tuple[LogitScorer, PromptBuilder]) -> None:
    scorer, builder = tiny
    scorer.cache.clear()
    first = builder.pointwise(HORROR[:4], ATTRS, ["Dumbo (1941)"])
    second = builder.pointwise(HORROR[:4], ATTRS, ["Alien (1979)", "Dumbo (1941)"])  # same user, next request
    hits = scorer.cache.hits
    a = scorer.logits(first)
    b = scorer.logits(second)
    assert scorer.cache.hits == hits + 1 and len(scorer.cache) == 1
    assert torch.allclose(a[0], b[1], atol=1e-5)

    lru = PrefixCache(2)
    for key in ((1,), (2,), (1,), (3,)):
        if lru.get(key) is None:
            lru.put(key, object())  # type: ignore[arg-type]
    assert lru.get((2,)) is None and lru.get((1,)) is not None and lru.get((3,)) is not None
    assert len(PrefixCache(0)) == 0


def test_lm_head_runs_only_where_logits_are_read(tiny: tuple[LogitScorer, PromptBuilder]) -> None:
    """The prefix pass keeps no logits, and a lone row with nothing to cache is one pass (measured:
    the LM head over every prefix token had cost the fp32/int8 stage ~190 ms per request)."""
    scorer, builder = tiny
    seen: list[tuple[int, int]] = []
    hook = scorer.model.lm_head.register_forward_hook(lambda _m, args, _o: seen.append(tuple(args[0].shape[:2])))
    try:
        parts = builder.pointwise(ANIMATION[:2], ATTRS, ["Alien (1979)", "Psycho (1960)"])
        scorer.cache.clear()
        scorer.logits(parts)  # prefix pass + one suffix batch
        assert seen == [(1, 1), (2, 1)]
        seen.clear()
        uncached = LogitScorer(scorer.model, scorer.pad_id, cache=PrefixCache(0))
        passes: list[int] = []
        pre = scorer.model.register_forward_pre_hook(lambda _m, _a, kw: passes.append(kw["input_ids"].shape[1]),
                                                     with_kwargs=True)
        try:
            listwise = builder.listwise(ANIMATION[:2], ATTRS, HORROR)
            uncached.logits(listwise)
        finally:
            pre.remove()
        assert passes == [len(listwise.prefix) + len(listwise.suffixes[0])] and seen == [(1, 1)]
    finally:
        hook.remove()


@pytest.mark.parametrize("path", ["full rows", "prefix cache"])
def test_mixed_length_rows_in_one_padded_pass_score_as_each_row_alone(
        tiny: tuple[LogitScorer, PromptBuilder], path: str) -> None:
    """Right padding under causal attention: a real token never sees the pads after it, and
    positions count from 0 (or the cached prefix length) in every row, so a row's answer logits do
    not depend on the other rows of its batch (measured max |diff|: 6e-6 on the
    logits, 2.4e-6 on the stage scores)."""
    scorer, builder = tiny
    prefix = builder.listwise(HORROR[:2], ATTRS, ["Alien (1979)"]).prefix
    suffixes = [builder.listwise([], {}, titles).suffixes[0]
                for titles in (ANIMATION[:1], HORROR[:5], ["A Much Longer Title For Padding (2001)"] * 3)]
    assert len({len(s) for s in suffixes}) == 3
    with torch.inference_mode():
        if path == "full rows":
            rows = [prefix + s for s in suffixes]
            batched = row_logits(scorer.model, rows, scorer.pad_id)
            alone = torch.cat([row_logits(scorer.model, [r], scorer.pad_id) for r in rows])
        else:
            state = run_prefix(scorer.model, prefix)
            batched = suffix_logits(scorer.model, state, suffixes, scorer.pad_id)
            alone = torch.cat([suffix_logits(scorer.model, state, [s], scorer.pad_id) for s in suffixes])
            # and the cached prefix + suffix equals the whole row in one pass
            whole = torch.cat([row_logits(scorer.model, [prefix + s], scorer.pad_id) for s in suffixes])
            assert (alone - whole).abs().max().item() < 1e-4
    assert batched.shape == alone.shape == (3, scorer.model.config.vocab_size)
    assert (batched - alone).abs().max().item() < 1e-4
    letters = builder.letter_ids
    for r in range(3):  # the scores the stage reads, row by row
        np.testing.assert_allclose(listwise_from_logits(batched[r : r + 1], letters, 5),
                                   listwise_from_logits(alone[r : r + 1], letters, 5), rtol=0, atol=1e-4)


@pytest.mark.parametrize("room", [0, 3])
def test_a_padded_batch_continued_step_by_step_scores_as_each_row_alone(
        tiny: tuple[LogitScorer, PromptBuilder], room: int) -> None:
    """``continue_batch``: rows of different lengths after one shared prefix, then two one-token
    steps (a decoding loop; with ``room`` the cache grows in place), equal each row run whole."""
    from llm_rerank.forward import BatchState, continue_batch

    scorer, builder = tiny
    prefix = builder.listwise(HORROR[:2], ATTRS, ["Alien (1979)"]).prefix
    rows = [builder.listwise([], {}, titles).suffixes[0] for titles in (ANIMATION[:1], HORROR[:4])]
    steps = [[7, 9], [11, 13]]
    with torch.inference_mode():
        state = BatchState.of_prefix(run_prefix(scorer.model, prefix), 2)
        first, state = continue_batch(scorer.model, state, rows, scorer.pad_id, logits=True, room=room)
        assert (state.live is not None) == (room > 0)
        outs = [first]
        for step in steps:
            out, state = continue_batch(scorer.model, state, [[t] for t in step], scorer.pad_id, logits=True)
            outs.append(out)
        for b in range(2):
            for k, out in enumerate(outs):
                whole = prefix + rows[b] + [s[b] for s in steps[:k]]
                expected = row_logits(scorer.model, [whole], scorer.pad_id)[0]
                assert (out[b] - expected).abs().max().item() < 1e-4
        hidden, grown = continue_batch(scorer.model, BatchState.of_prefix(run_prefix(scorer.model, prefix), 2),
                                       rows, scorer.pad_id)
    assert hidden.shape[:2] == (2, max(len(r) for r in rows)) and grown.lengths.tolist() == [
        len(prefix) + len(r) for r in rows]
    with pytest.raises(ValueError, match="one non-empty row per cached row"):
        continue_batch(scorer.model, grown, [[1]], scorer.pad_id)


def test_a_reserved_cache_grows_in_place_within_its_room_and_refuses_another_dtype() -> None:
    k_buf, v_buf = torch.zeros(1, 2, 5, 3), torch.zeros(1, 2, 5, 3)
    k_buf[:, :, :2], v_buf[:, :, :2] = 1.0, 2.0
    layer = reserved_cache([(k_buf, v_buf)], filled=2).layers[0]
    assert layer.get_seq_length() == 2 and layer.room == 3
    keys, values = layer.update(torch.full((1, 2, 2, 3), 3.0), torch.full((1, 2, 2, 3), 4.0))
    assert keys.shape == (1, 2, 4, 3) and keys.data_ptr() == k_buf.data_ptr()  # the buffer itself, no copy
    assert keys[0, 0, :, 0].tolist() == [1.0, 1.0, 3.0, 3.0] and values[0, 0, :, 0].tolist() == [2.0, 2.0, 4.0, 4.0]
    with pytest.raises(ValueError, match="room for 1"):
        layer.update(torch.zeros(1, 2, 2, 3), torch.zeros(1, 2, 2, 3))
    with pytest.raises(ValueError, match="holds torch.float32"):  # an in-place write would cast silently
        layer.update(torch.zeros(1, 2, 1, 3, dtype=torch.bfloat16), torch.zeros(1, 2, 1, 3, dtype=torch.bfloat16))
