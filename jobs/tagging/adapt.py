"""LoRA adaptation of the tagger on the catalog's known attributes (Hu et al. 2021).

Zero-shot SmolLM2-135M tags badly (Toy Story came out Action/Comedy/Drama, adult), so the
tagger is fine-tuned on items whose attributes the catalog knows: the target is the tag JSON
after the prefill, cut after the last known field (``prompt.target_completion``), with loss on
the target tokens only. Genres come from ``categories``; ``audience`` where the catalog has it;
``risk_flags`` = ["financial_risk"] where a known ``risk_level`` is >= 2, [] where it is lower.

Held-out discipline: the items in ``exclude`` (``quality.holdout_items``) are never trained
on, so the F1 reported on them measures generalisation, not memorised labels. The merged
model is saved to ``out_dir`` (a plain HF directory the tagger loads like the base model),
with the held-out list as ``holdout.json`` beside the weights: swapped in with them as one set
(``jobs.tagging.staging``), so a run that dies never leaves an old model with a new list.

Training runs under bf16 autocast by default (about 2x faster than fp32 on this CPU; the LoRA
weights and the optimiser stay fp32), in the loop every LLM-side job shares
(``llm_rerank.training_loop``). Deliberately left out: checkpoint/resume (a run takes
minutes), hyper-parameter search.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from jobs.tagging.prompt import prompt_description, render_prompt, target_completion
from jobs.tagging.staging import staged_dir
from llm_rerank.backbone import load_model, native_bf16
from llm_rerank.training_loop import LoraSpec, attach_lora, run_steps
from recsys.atomic import atomic_write_json

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class AdaptSettings:
    epochs: int = 2
    batch_size: int = 8
    lr: float = 1e-3
    lora_r: int = 8
    lora_alpha: int = 16
    max_genres: int = 3
    max_items: int | None = None
    seed: int = 0
    threads: int | None = None
    autocast_bf16: bool | None = None  # None: on where bf16 is native (llm_rerank.backbone.native_bf16)


def known_fields(row: pd.Series, max_genres: int) -> dict[str, Any]:
    """The tag fields the catalog itself states for one item."""
    known: dict[str, Any] = {"genres": [str(c) for c in row["categories"]][:max_genres]}
    if isinstance(row.get("audience"), str):
        known["audience"] = row["audience"]
    risk = row.get("risk_level")
    if risk is not None and not pd.isna(risk):
        known["risk_flags"] = ["financial_risk"] if int(risk) >= 2 else []
    return known


def build_examples(tok: Any, items: pd.DataFrame, categories: list[str], train_idx: np.ndarray,
                   domain: str, max_genres: int, title_chars: int = 60) -> list[tuple[list[int], int]]:
    """(token ids of prompt + target, prompt length) for every trainable item in ``train_idx``."""
    examples = []
    for idx in train_idx:
        row = items.iloc[int(idx)]
        if len(row["categories"]) == 0:
            continue
        desc = prompt_description(str(row["title"]), str(row["text"] or ""), categories, 200)
        prompt = tok(render_prompt(tok, domain, str(row["title"]), desc, title_chars), add_special_tokens=False)
        target = tok(target_completion(known_fields(row, max_genres)), add_special_tokens=False)
        ids = list(prompt["input_ids"]) + list(target["input_ids"])
        examples.append((ids, len(prompt["input_ids"])))
    if not examples:
        raise ValueError("adaptation: no training item has categories")
    return examples


def adapt_tagger(base_dir: str, items: pd.DataFrame, categories: list[str], exclude: np.ndarray,
                 out_dir: Path, settings: AdaptSettings, domain: str = "movie",
                 progress: bool = True, holdout: dict[str, Any] | None = None) -> dict[str, Any]:
    """Fine-tune ``base_dir`` with LoRA on the catalog minus ``exclude``; save merged to ``out_dir``,
    with ``holdout`` (the record of ``exclude``) as ``out_dir/holdout.json`` in the same set."""
    import torch  # lazy: heavy (torch)

    t0 = time.perf_counter()
    torch.manual_seed(settings.seed)
    model, tok = load_model(base_dir, "fp32", settings.threads)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    train_idx = np.setdiff1d(np.arange(len(items)), exclude)
    rng = np.random.default_rng(settings.seed)
    if settings.max_items is not None:
        train_idx = np.sort(rng.permutation(train_idx)[: settings.max_items])
    examples = build_examples(tok, items, categories, train_idx, domain, settings.max_genres)
    model = attach_lora(model, LoraSpec(settings.lora_r, settings.lora_alpha, 0.0, LORA_TARGETS))
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=settings.lr)
    autocast = native_bf16() if settings.autocast_bf16 is None else settings.autocast_bf16
    order = [rng.permutation(len(examples)) for _ in range(settings.epochs)]
    steps = [o[i : i + settings.batch_size] for o in order for i in range(0, len(o), settings.batch_size)]
    losses = run_steps(optim, steps, lambda _, step: _batch_loss(model, [examples[i] for i in step], pad),
                       desc="tag adapt", progress=progress, autocast=autocast)
    merged: Any = model.merge_and_unload()
    report = {"base": base_dir, "train_items": len(examples), "held_out_items": int(len(exclude)),
              "steps": len(steps), "loss_first": losses[0], "loss_last10": float(np.mean(losses[-10:])),
              "losses": losses,
              "seconds": time.perf_counter() - t0, "settings": asdict(settings)}
    with staged_dir(Path(out_dir)) as tmp:
        merged.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        atomic_write_json(tmp / "adapt_report.json", report)
        if holdout is not None:
            atomic_write_json(tmp / "holdout.json", holdout, indent=None)
    return report


def _batch_loss(model: Any, batch: list[tuple[list[int], int]], pad: int) -> Any:
    """Cross-entropy on the target tokens only (prompt positions are labelled -100)."""
    import torch  # lazy: heavy (torch)

    width = max(len(ids) for ids, _ in batch)
    input_ids = torch.full((len(batch), width), pad, dtype=torch.long)
    labels = torch.full((len(batch), width), -100, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for r, (ids, n_prompt) in enumerate(batch):
        input_ids[r, : len(ids)] = torch.tensor(ids)
        labels[r, n_prompt : len(ids)] = torch.tensor(ids[n_prompt:])
        mask[r, : len(ids)] = 1
    return model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
