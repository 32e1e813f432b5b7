"""The model side of the block prefix cache: KV blocks as tensors and bytes, prefix assembly.

``BlockPrefixCache.state(prefix)`` looks up the chained block keys of the prefix
(``llm_rerank.kvcache``), copies the cached blocks' keys/values once into one buffer with room
for the rest, runs the model only on the tokens after them (positions continue from the cached
length; the model writes their keys/values into that room in place), and stores the newly
completed blocks. The result is a ``PrefixState`` that ``llm_rerank.forward`` continues
exactly as if the whole prefix had run at once. ``prompt_logits(row)`` does the same over a
whole listwise prompt and returns the answer logits of that same pass: a warm request runs one
forward pass over the last, partial block, where a prefix pass then a last-token pass would run
the model twice and copy every layer's keys/values three times (``docs/llm-reranking.md``, Where
the time goes).

A block value is one tensor ``[layers, 2, kv_heads, block_tokens, head_dim]`` (keys and
values of every layer). Tier 2 holds it as a 16-byte header + raw little-endian data in the
model's dtype by default (bf16 stays bf16, fp32 stays fp32 and exact) or cast to bf16/fp16.

Sliding-window layers (Gemma 3: five in six layers attend only to the last ``sliding_window``
tokens) need nothing special: the caches built here and in ``llm_rerank.forward`` are plain
``DynamicCache()``s (or their reserved-room layers), whose layers all keep every position, and transformers applies the window
in the mask by absolute position, so block i holds the same keys/values in every layer type.
``DynamicCache(config=...)`` would give those layers ``DynamicSlidingWindowLayer``s that keep
only the window, which would misplace blocks; ``state`` refuses a cache of the wrong length.

Deliberately left out: sharing blocks between models (the namespace includes the model version).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from llm_rerank.forward import PrefixState, reserved_cache
from llm_rerank.kvcache import RedisTier, Tier1, TwoTierCache, block_keys

_DTYPES = {0: torch.float32, 1: torch.bfloat16, 2: torch.float16}
_CODES = {v: k for k, v in _DTYPES.items()}
_HEADER = struct.Struct("<B5H5x")  # dtype code + 5 dims, padded to 16 bytes


def encode_block(block: torch.Tensor, dtype: torch.dtype | None = None) -> bytes:
    """Header + raw bytes of ``block`` (5-d), cast to ``dtype`` when given."""
    t = block if dtype is None else block.to(dtype)
    if t.dim() != 5 or t.dtype not in _CODES:
        raise ValueError(f"encode_block: need a 5-d fp32/bf16/fp16 tensor, got {tuple(t.shape)} {t.dtype}")
    raw = t.contiguous().view(torch.uint8).numpy().tobytes()  # view(uint8): bf16 has no numpy dtype
    return _HEADER.pack(_CODES[t.dtype], *t.shape) + raw


def decode_block(data: bytes, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Inverse of ``encode_block``; cast to ``dtype`` (the model's) when given."""
    if len(data) < _HEADER.size:
        raise ValueError(f"decode_block: {len(data)} bytes is shorter than the header")
    code, *shape = _HEADER.unpack_from(data)
    if code not in _DTYPES:
        raise ValueError(f"decode_block: unknown dtype code {code}")
    flat = torch.from_numpy(np.frombuffer(data, dtype=np.uint8, offset=_HEADER.size).copy())
    t = flat.view(_DTYPES[code]).reshape(shape)
    return t if dtype is None else t.to(dtype)


def block_nbytes(block: torch.Tensor) -> int:
    return block.numel() * block.element_size()


def assembled_cache(blocks: Sequence[torch.Tensor], length: int) -> Any:
    """A cache holding ``blocks`` ([layers, 2, kv_heads, block_tokens, head_dim] each) in a row, with
    room up to ``length`` positions: one copy of the blocks into one buffer, which the model then
    extends in place (``llm_rerank.forward.reserved_cache``)."""
    layers, _, heads, _, dim = blocks[0].shape
    filled = sum(b.shape[3] for b in blocks)
    buf = blocks[0].new_empty((layers, 2, heads, length, dim))
    torch.cat(list(blocks), dim=3, out=buf[:, :, :, :filled])
    return reserved_cache([(buf[i, 0].unsqueeze(0), buf[i, 1].unsqueeze(0)) for i in range(layers)], filled)


def run_tail(model: Any, cache: Any, tokens: Sequence[int], start: int) -> torch.Tensor:
    """Next-token logits [1, V] after ``tokens``: one forward pass over ``tokens[start:]`` (positions
    from ``start``) continuing ``cache``, which holds the first ``start`` positions and grows by the rest.
    The LM head runs on the last position only."""
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([list(tokens[start:])], dtype=torch.long), cache=cache,
                    position_ids=torch.arange(start, len(tokens)).unsqueeze(0), use_cache=True, logits_to_keep=1)
    return out.logits[:, -1].float()


class BlockPrefixCache:
    """Prefix KV states assembled from cached blocks; see the module docstring."""

    def __init__(self, model: Any, cache: TwoTierCache, block_tokens: int, namespace: str):
        self.model, self.cache = model, cache
        self.block_tokens, self.namespace = block_tokens, namespace

    @classmethod
    def build(cls, model: Any, *, block_tokens: int = 16, tier1_bytes: int = 256 << 20, namespace: str = "",
              redis_client: Any = None, kv_dtype: str = "model", **tier2: Any) -> BlockPrefixCache:
        model_dtype = next(model.parameters()).dtype
        wire = {"model": None, "bf16": torch.bfloat16, "fp16": torch.float16}[kv_dtype]
        tier2_store = RedisTier(redis_client, **tier2) if redis_client is not None else None
        cache = TwoTierCache(Tier1(tier1_bytes), tier2_store, encode=lambda b: encode_block(b, wire),
                             decode=lambda raw: decode_block(raw, model_dtype), size=block_nbytes)
        return cls(model, cache, block_tokens, f"{namespace}|{model_dtype}|{block_tokens}")

    def state(self, prefix: Sequence[int]) -> PrefixState:
        """Keys/values of ``prefix`` (a pointwise prompt's shared part); stores its blocks."""
        kv, _ = self._extend(prefix, keyed=len(prefix))
        return PrefixState(kv=kv, length=len(prefix))

    def prompt_logits(self, row: Sequence[int]) -> torch.Tensor:
        """Next-token logits [1, V] after ``row`` (a whole listwise prompt), from one forward pass over the
        tokens after its cached blocks; stores its blocks. Blocks cover ``row[:-1]`` only: the last
        token always runs, since the answer is read at its position."""
        _, logits = self._extend(row, keyed=len(row) - 1)
        if logits is None:
            raise ValueError("prompt_logits: empty row")
        return logits

    def _extend(self, tokens: Sequence[int], keyed: int) -> tuple[list[tuple[torch.Tensor, torch.Tensor]],
                                                                    torch.Tensor | None]:
        """(keys/values of ``tokens`` per layer, next-token logits [1, V] after them or None when no token
        ran): the cached blocks of ``tokens[:keyed]``, then the model over the rest in one pass, written
        in place after the cached blocks in one buffer; the newly completed blocks are stored."""
        from transformers import DynamicCache  # lazy: imports transformers (and torch)

        keys = block_keys(tokens[:keyed], self.block_tokens, self.namespace)
        blocks = self.cache.lookup(keys)
        n_cached = len(blocks) * self.block_tokens
        cache = assembled_cache(blocks, len(tokens)) if blocks else DynamicCache()
        rest = len(tokens) > n_cached
        logits = run_tail(self.model, cache, tokens, n_cached) if rest else None
        kv = [(getattr(layer, "keys"), getattr(layer, "values")) for layer in cache.layers]  # noqa: B009
        short = [i for i, (k, _) in enumerate(kv) if k.shape[2] != len(tokens)]
        if rest and short:
            raise RuntimeError(f"block prefix cache: layers {short} hold fewer than the {len(tokens)} prefix "
                               "positions (a sliding-window cache layer?); blocks need full layers")
        new = []
        for b in range(len(blocks), len(keys)):
            lo, hi = b * self.block_tokens, (b + 1) * self.block_tokens
            block = torch.stack([torch.stack([k[0, :, lo:hi], v[0, :, lo:hi]]) for k, v in kv]).contiguous()
            new.append((keys[b], block))
        self.cache.store(new)
        return kv, logits

    def stats(self) -> dict[str, float]:
        return self.cache.stats()
