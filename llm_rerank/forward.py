"""Next-token logits and candidate scores from them, with the shared prefix computed once.

Two modes over the same ``PromptParts``:

- pointwise (TALLRec, Bao et al. 2023): score = P(Yes) / (P(Yes) + P(No)) at the answer
  position after each candidate. The prefix runs once; its keys/values are expanded along
  the batch dimension and every candidate suffix runs in one batched forward pass over that
  cache (right-padded: causal attention keeps pads invisible to the real tokens before them).
- listwise (LlamaRec, Yue et al. 2023): one forward pass over the lettered list; score =
  log-softmax of the candidate letter logits at the answer position (a verbalizer).

``PrefixCache`` is plain LRU bookkeeping keyed by the prefix token ids, so a user's next
request with the same history window skips the prefix entirely. With ``blocks`` (a
``llm_rerank.prefix_kv.BlockPrefixCache``) prefixes come from the two-tier block cache instead,
which also reuses partial matches (the shared instruction) and is shared across processes.

The maths from verbalizer logits to scores is ``llm_rerank.verbalizer_scores`` (shared with the HTTP backend).

Deliberately left out: prompt text (``llm_rerank.prompt``), the Stage glue (``llm_rerank.stage``).
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from llm_rerank.prompt import PromptParts
from llm_rerank.verbalizer_scores import listwise_scores, pointwise_scores


@dataclass
class PrefixState:
    """Keys/values of a prefix (one tuple per layer, batch 1) and its length."""

    kv: list[tuple[Any, Any]]
    length: int


@dataclass
class BatchState:
    """Keys/values of B cached rows of different real lengths: the rows are right-padded, ``mask``
    (LongTensor [B, T], 1 = real token) hides the pads from every later token, and a row's next
    position is its own real length (``lengths``), so a padded row attends and is positioned exactly
    as if it ran alone. Built from a shared ``PrefixState`` (``of_prefix``) and grown by
    ``continue_batch``; its tensors are never changed (a continuation concatenates new ones, or
    writes past their end into a live cache's reserved room, which it then takes over)."""

    kv: list[tuple[Any, Any]]
    mask: Any
    lengths: Any
    live: Any = None  # a cache with reserved room (``continue_batch(room=...)``), grown in place by the next call

    @classmethod
    def of_prefix(cls, state: PrefixState, batch: int) -> BatchState:
        import torch  # lazy: imports torch

        return cls([(k.expand(batch, -1, -1, -1), v.expand(batch, -1, -1, -1)) for k, v in state.kv],
                   torch.ones((batch, state.length), dtype=torch.long), torch.full((batch,), state.length))

    def repeat(self, n: int) -> BatchState:
        """Each row ``n`` times in a row (row b -> rows b*n .. b*n+n-1)."""
        return BatchState([(k.repeat_interleave(n, dim=0), v.repeat_interleave(n, dim=0)) for k, v in self.kv],
                          self.mask.repeat_interleave(n, dim=0), self.lengths.repeat_interleave(n, dim=0))


def continue_batch(model: Any, state: BatchState, rows: Sequence[Sequence[int]], pad_id: int, *,
                   logits: bool = False, room: int = 0) -> tuple[Any, BatchState]:
    """Run row b of ``rows`` after row b of ``state`` in one batched pass.

    Returns (next-token logits [B, V] after each row's last real token when ``logits``, else the
    final hidden states [B, T, H] of every row position, and the grown ``BatchState``).

    ``room`` > 0 reserves space for that many more tokens per row (a decoding loop): the
    returned state is *live*, its keys/values written in place by the next call instead of
    copied into a longer tensor at every step (the copy was a fifth of a decoding step's time
    for SmolLM2 at batch 32). A live state can be continued once; a state without room is
    never changed.
    """
    import torch  # lazy: imports torch
    from transformers import DynamicCache  # lazy: imports transformers (and torch)

    if len(rows) != len(state.lengths) or not all(rows):
        raise ValueError(f"continue_batch: need one non-empty row per cached row ({len(state.lengths)}), "
                         f"got {[len(r) for r in rows]}")
    ids, last = _pad_right(rows, pad_id)
    real = (torch.arange(ids.shape[1]).unsqueeze(0) <= last.unsqueeze(1)).long()
    mask = torch.cat([state.mask, real], dim=1)
    positions = state.lengths.unsqueeze(1) + torch.arange(ids.shape[1]).unsqueeze(0)
    if state.live is not None:
        cache, state.live = state.live, None  # consumed: the next call grows it in place
        if any(layer.room < ids.shape[1] for layer in cache.layers):
            raise ValueError("continue_batch: the live cache has no room left for these rows")
    elif room > 0:
        cache = DynamicCache()
        cache.layers = [_reserved_layer_class().holding(k, v, ids.shape[1] + room) for k, v in state.kv]
    else:
        cache = DynamicCache(ddp_cache_data=list(state.kv))
    kwargs = {"attention_mask": mask, "position_ids": positions, "cache": cache, "use_cache": True}
    if logits:
        keep, where = torch.unique(last, return_inverse=True)
        out = model(input_ids=ids, logits_to_keep=keep, **kwargs).logits[torch.arange(len(rows)), where].float()
    else:
        out = model.get_decoder()(input_ids=ids, **kwargs).last_hidden_state
    kv = [(getattr(layer, "keys"), getattr(layer, "values")) for layer in cache.layers]  # noqa: B009 (union type)
    live = cache if hasattr(cache.layers[0], "room") else None
    return out, BatchState(kv, mask, state.lengths + last + 1, live)


@functools.cache
def _reserved_layer_class() -> Any:
    """The class of a live cache's layers, built on first use (importing this module imports no transformers)."""
    from transformers.cache_utils import DynamicLayer  # lazy: imports transformers (and torch)

    class ReservedLayer(DynamicLayer):
        """A ``DynamicLayer`` whose keys/values are views into buffers with room to grow in place."""

        room: int
        _n: int
        _k: Any
        _v: Any

        @classmethod
        def holding(cls, keys: Any, values: Any, room: int) -> Any:
            """A copy of ``keys``/``values`` [B, H, T, D] with room for ``room`` more positions."""
            b, h, t, d = keys.shape
            k_buf, v_buf = keys.new_empty((b, h, t + room, d)), values.new_empty((b, h, t + room, values.shape[-1]))
            k_buf[:, :, :t], v_buf[:, :, :t] = keys, values
            return cls.over(k_buf, v_buf, t)

        @classmethod
        def over(cls, k_buf: Any, v_buf: Any, filled: int) -> Any:
            """The buffers [B, H, T, D] themselves (no copy): their first ``filled`` positions hold
            keys/values, the rest is room."""
            layer = cls()
            layer._k, layer._v = k_buf, v_buf
            layer._n, layer.room, layer.device, layer.is_initialized = filled, k_buf.shape[2] - filled, k_buf.device, True
            layer.keys, layer.values = k_buf[:, :, :filled], v_buf[:, :, :filled]
            return layer

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            t = key_states.shape[-2]
            if t > self.room:
                raise ValueError(f"reserved cache layer: {t} new tokens but room for {self.room}")
            if key_states.dtype != self._k.dtype:  # an in-place write would cast silently
                raise ValueError(f"reserved cache layer holds {self._k.dtype}, the model gave {key_states.dtype}")
            self._k[:, :, self._n:self._n + t] = key_states
            self._v[:, :, self._n:self._n + t] = value_states
            self._n, self.room = self._n + t, self.room - t
            self.keys, self.values = self._k[:, :, :self._n], self._v[:, :, :self._n]
            return self.keys, self.values

    return ReservedLayer


def reserved_cache(buffers: Sequence[tuple[Any, Any]], filled: int) -> Any:
    """A ``DynamicCache`` over per-layer (keys, values) buffers [B, H, T, D] whose first ``filled``
    positions are computed: the model writes the next positions into them in place, where a plain
    cache would copy every layer's keys/values into a longer tensor at each call."""
    from transformers import DynamicCache  # lazy: imports transformers (and torch)

    cache = DynamicCache()
    cache.layers = [_reserved_layer_class().over(k, v, filled) for k, v in buffers]
    return cache


class PrefixCache:
    """LRU map from prefix token ids to ``PrefixState``; capacity 0 stores nothing."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._data: OrderedDict[tuple[int, ...], PrefixState] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple[int, ...]) -> PrefixState | None:
        state = self._data.get(key)
        if state is None:
            self.misses += 1
            return None
        self._data.move_to_end(key)
        self.hits += 1
        return state

    def put(self, key: tuple[int, ...], state: PrefixState) -> None:
        if self.capacity <= 0:
            return
        self._data[key] = state
        self._data.move_to_end(key)
        while len(self._data) > self.capacity:
            self._data.popitem(last=False)

    def clear(self) -> None:
        self._data.clear()

    def __len__(self) -> int:
        return len(self._data)


def _pad_right(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[Any, Any]:
    """(LongTensor [B, T] right-padded, LongTensor [B] index of each row's last real token)."""
    import torch  # lazy: imports torch

    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    last = torch.tensor([len(r) - 1 for r in rows], dtype=torch.long)
    return ids, last


def answer_logits(model: Any, rows: Sequence[Sequence[int]], pad_id: int) -> Any:
    """Next-token logits [B, V] after each full row (no cache); differentiable (used in training)."""
    ids, last = _pad_right(rows, pad_id)
    return _last_logits(model, ids, last, use_cache=False)


def _last_logits(model: Any, ids: Any, last: Any, **kwargs: Any) -> Any:
    """Logits at ``last[b]`` of each row; the LM head runs only on those positions (it is ~20 % of
    the forward FLOPs for a 400-token prompt over SmolLM2's 49k vocabulary)."""
    import torch  # lazy: imports torch

    keep, where = torch.unique(last, return_inverse=True)
    out = model(input_ids=ids, logits_to_keep=keep, **kwargs)
    return out.logits[torch.arange(ids.shape[0]), where].float()


def row_logits(model: Any, rows: Sequence[Sequence[int]], pad_id: int) -> Any:
    """Like ``answer_logits`` without gradients or the full-sequence LM head (serving, batching)."""
    ids, last = _pad_right(rows, pad_id)
    return _last_logits(model, ids, last, use_cache=False)


def run_prefix(model: Any, prefix: Sequence[int]) -> PrefixState:
    """Forward the prefix once (batch 1) and keep its keys/values."""
    import torch  # lazy: imports torch
    from transformers import DynamicCache  # lazy: imports transformers (and torch)

    cache = DynamicCache()
    # logits_to_keep=1: the prefix's own logits are never read, and the LM head over every prefix
    # token cost more than the rest of the pass in fp32 (49k vocabulary)
    model(input_ids=torch.tensor([list(prefix)], dtype=torch.long), cache=cache, use_cache=True, logits_to_keep=1)
    kv = [(getattr(layer, "keys"), getattr(layer, "values")) for layer in cache.layers]  # noqa: B009 (union type)
    return PrefixState(kv=kv, length=len(prefix))


def _continuation(state: PrefixState, suffixes: Sequence[Sequence[int]], pad_id: int) -> tuple[Any, Any, dict]:
    """(ids [B, T] right-padded, last real index per row, model kwargs continuing ``state``'s prefix)."""
    import torch  # lazy: imports torch
    from transformers import DynamicCache  # lazy: imports transformers (and torch)

    ids, last = _pad_right(suffixes, pad_id)
    batch = len(suffixes)
    # expand() is a view; DynamicLayer.update concatenates, so the stored prefix is never mutated
    cache = DynamicCache(ddp_cache_data=[(k.expand(batch, -1, -1, -1), v.expand(batch, -1, -1, -1))
                                         for k, v in state.kv])
    position_ids = torch.arange(state.length, state.length + ids.shape[1]).unsqueeze(0).expand(batch, -1)
    return ids, last, {"cache": cache, "position_ids": position_ids, "use_cache": True}


def suffix_logits(model: Any, state: PrefixState, suffixes: Sequence[Sequence[int]], pad_id: int) -> Any:
    """Next-token logits [B, V] after each suffix, continuing the cached prefix."""
    ids, last, kwargs = _continuation(state, suffixes, pad_id)
    return _last_logits(model, ids, last, **kwargs)


def suffix_hidden(model: Any, state: PrefixState, suffixes: Sequence[Sequence[int]], pad_id: int
                  ) -> tuple[Any, Any, Any]:
    """(final hidden states [B, T, H] of every suffix position, last real index per row [B], the
    right-padded ids [B, T]), continuing the cached prefix: for reading logits at chosen positions
    (a title's likelihood, ``bench.llm_backbones``) without the LM head over every position."""
    ids, last, kwargs = _continuation(state, suffixes, pad_id)
    return model.get_decoder()(input_ids=ids, **kwargs).last_hidden_state, last, ids


def pointwise_from_logits(logits: Any, yes_id: int, no_id: int) -> np.ndarray:
    """P(Yes) / (P(Yes) + P(No)) per row of logits [B, V] (``llm_rerank.verbalizer_scores.pointwise_scores``)."""
    return pointwise_scores(logits[:, yes_id].cpu().numpy(), logits[:, no_id].cpu().numpy())


def listwise_from_logits(logits: Any, letter_ids: Sequence[int], n: int) -> np.ndarray:
    """Log-softmax over the first ``n`` letter tokens at the answer position (row 0;
    ``llm_rerank.verbalizer_scores.listwise_scores``)."""
    return listwise_scores(logits[0, list(letter_ids[:n])].cpu().numpy())


class LogitScorer:
    """Scores ``PromptParts`` with a causal LM; ``check`` is called between batches (deadline)."""

    def __init__(self, model: Any, pad_id: int, *, batch_size: int = 32, cache: PrefixCache | None = None,
                 blocks: Any = None):
        self.model = model
        self.pad_id = pad_id
        self.batch_size = batch_size
        self.cache = cache if cache is not None else PrefixCache(0)
        self.blocks = blocks  # llm_rerank.prefix_kv.BlockPrefixCache: two-tier block cache, used when set

    def prefix_state(self, prefix: Sequence[int]) -> PrefixState:
        key = tuple(prefix)
        state = self.cache.get(key)
        if state is None:
            state = self.blocks.state(prefix) if self.blocks is not None else run_prefix(self.model, prefix)
            self.cache.put(key, state)
        return state

    def logits(self, parts: PromptParts, *, use_cache: bool = True,
               check: Callable[[], None] = lambda: None) -> Any:
        """Answer-position logits [len(parts.suffixes), V]."""
        import torch  # lazy: imports torch

        with torch.inference_mode():
            check()
            if use_cache and self.blocks is not None and len(parts.suffixes) == 1:
                # one row (listwise): cache blocks over the whole prompt, as vLLM's prefix caching does,
                # so a repeated request (same history and candidates) recomputes only its last block
                return self.blocks.prompt_logits(list(parts.prefix) + list(parts.suffixes[0]))
            # one row and no cache to fill: a single pass over the row beats prefix pass + suffix pass
            split = use_cache and (len(parts.suffixes) > 1 or self.cache.capacity > 0)
            state = self.prefix_state(parts.prefix) if split else None
            chunks = []
            for start in range(0, len(parts.suffixes), self.batch_size):
                check()
                batch = parts.suffixes[start : start + self.batch_size]
                if state is not None:
                    chunks.append(suffix_logits(self.model, state, batch, self.pad_id))
                else:
                    rows = [parts.prefix + s for s in batch]
                    chunks.append(row_logits(self.model, rows, self.pad_id))
            return torch.cat(chunks)
