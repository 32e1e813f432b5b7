"""Domain adaptation of the re-ranker's LLM with LoRA (Hu et al. 2021), merged for serving.

Examples come from the project's own candidates, so the model learns to fix the coarse
ranker's mistakes (as in LlamaRec's retrieve-then-rank training): history -> one held
positive, negatives = the top candidates of ``candidate_stage`` (a pipeline cut after coarse)
other than the positive. Listwise loss = cross-entropy over the candidate letters at the
answer position; pointwise loss = BCE on logit(Yes) - logit(No) for the positive and each
negative. Where the positives come from (``AdaptConfig.positives``):

- ``"valid"`` (default): the valid item of a fixed share of users (``llm_valid_users``), given
  their whole train sequence, the exact input the cascade serves. Recall and coarse never
  trained on valid items, so their order on these examples is as good as at serving time, and
  listwise candidates keep that order (the positive at its rank; inserted at a random slot
  when the cascade missed it): the LLM learns how far to trust the coarse order and when the
  titles say otherwise. Those users are then left out of fusion tuning
  (``jobs.fusion_gate.tune_fusion`` reads ``valid_users`` from ``train_meta.json``); the test
  split is never read.
- ``"train"``: the last train item, given the items before it. The cascade has seen these
  positives (recall trains on the whole train sequence, coarse uses the last items as labels),
  so on them it ranks the positive first far more often than at serving time; a model trained
  on that order learns "answer A" and serves a blurred copy of the coarse order (measured on
  ML-100K: valid NDCG@10 0.1036 against coarse 0.1153, fusion weight tuned to 0). Listwise
  candidates are therefore shuffled for this source.

``residual`` (listwise): the loss is taken on ``letters + beta * z(coarse score)`` instead of the
letters alone, ``beta`` starting from the fit of the coarse order alone (``fit_prior_beta``) and
learnt with the adapter. The LLM then spends its few hundred steps on what the coarse order
gets wrong instead of first re-learning that order from the letter positions; the stage serves
the same sum (``LLMRerankStage.residual_beta``, read from ``train_meta.json``).

``keep_candidate_order`` overrides the per-source default. Prompts are built by
``llm_rerank.prompt.RequestPrompts``, as the stage builds them, so training and serving match exactly. Checkpoints (adapter +
optimizer + step) land in ``<artifact_dir>/llm/checkpoints`` and a rerun resumes from the last
one; the merged model is written to ``<artifact_dir>/llm``.

Deliberately left out: evaluation (``recsys eval``), multi-process training.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from llm_rerank.backbone import load_model, native_bf16, resolve_model
from llm_rerank.config import AdaptConfig, LLMConfig
from llm_rerank.forward import answer_logits
from llm_rerank.item_text import item_labels
from llm_rerank.meta import TRAIN_META
from llm_rerank.prompt import PromptBuilder, RequestPrompts, pad_token_id
from llm_rerank.training_loop import Checkpoints, LoraSpec, attach_lora, resume, run_steps
from llm_rerank.verbalizer_scores import zscore
from offline.split import Split, prepared_item_noun
from recsys.contract import Candidates, Stage
from recsys.progress import progress_bar


@dataclass(frozen=True)
class Example:
    """One training example: ``candidates[target]`` is the positive."""

    user_idx: int
    history: np.ndarray
    candidates: np.ndarray
    target: int
    prior: np.ndarray | None = None  # z-scored incoming-stage scores of ``candidates`` (residual training)


def llm_valid_users(n_users: int, share: float, seed: int) -> np.ndarray:
    """The users whose valid item trains the LLM (sorted): a seeded ``share`` of all users."""
    if not 0.0 < share < 1.0:
        raise ValueError(f"llm.adapt.valid_share must be in (0, 1), got {share}")
    rng = np.random.default_rng([seed, 0x11A])
    return np.sort(rng.permutation(n_users)[: int(round(share * n_users))]).astype(np.int64)


def build_examples(split: Split, candidate_stage: Stage, *, n_users: int, n_candidates: int,
                   listwise: bool, seed: int, keep_order: bool | None = None, positives: str = "train",
                   valid_share: float = 0.5) -> list[Example]:
    """Up to ``n_users`` examples, one per sampled user (see the module doc for ``positives``)."""
    rng = np.random.default_rng(seed)
    if positives == "valid":
        pool = llm_valid_users(split.n_users, valid_share, seed)
        if hasattr(split, "valid_trainable"):  # a new item of the cold-item protocol is never a positive
            pool = pool[split.valid_trainable()[pool]]
    elif positives == "train":
        pool = np.array([u for u, s in enumerate(split.train_sequences) if len(s) >= 2], dtype=np.int64)
    else:
        raise ValueError(f"llm.adapt.positives must be 'train' or 'valid', got {positives!r}")
    if len(pool) == 0:
        raise ValueError("train_llm: no eligible user (positives='train' needs >= 2 training interactions)")
    keep = positives == "valid" if keep_order is None else keep_order
    users = rng.choice(pool, size=min(n_users, len(pool)), replace=False)
    examples = []
    for u in users:
        if positives == "valid":
            history, positive = split.history(int(u), "valid"), int(split.valid[int(u)])
        else:
            seq = split.train_sequences[int(u)]
            history, positive = seq[:-1], int(seq[-1])
        request = split.request(int(u), history, k=n_candidates)
        got = candidate_stage.run(request, Candidates.empty())
        found = got.items
        negatives = [int(i) for i in found if int(i) != positive][: n_candidates - 1]
        if not negatives:
            continue
        ranked = [int(i) for i in found[:n_candidates]]
        if listwise and keep and positive in ranked:
            cands = [i for i in ranked if i == positive or i in negatives]
            target = cands.index(positive)
        elif listwise:
            cands = [negatives[i] for i in rng.permutation(len(negatives))] if not keep else negatives
            target = int(rng.integers(0, len(cands) + 1))
            cands = cands[:target] + [positive] + cands[target:]
        else:
            cands, target = [positive] + negatives, 0
        examples.append(Example(int(u), history, np.asarray(cands, dtype=np.int64), target,
                                _prior(got, ranked, cands, target) if listwise else None))
    return examples


def _prior(got: Candidates, ranked: list[int], cands: list[int], target: int) -> np.ndarray:
    """``zscore`` of the candidate stage's score of each of ``cands`` (residual training).

    A positive the stage did not rank among ``ranked`` was inserted at a random slot ``target``;
    it gets the score the stage gave that slot, so its prior follows its position like every
    other candidate's. Its own (low, or absent) score would single it out: measured on ML-100K,
    that made the prior anti-predictive (the fitted weight went negative), a lesson the serving
    side could never use.
    """
    col = got.scores.get(got.order_by) if got.order_by else None
    if col is None or len(col) == 0:
        return np.zeros(len(cands), dtype=np.float32)
    score = dict(zip(got.items.tolist(), np.asarray(col, dtype=np.float64).tolist(), strict=True))
    raw = [score.get(i, np.nan) for i in cands]
    if cands[target] not in ranked:
        raw[target] = score.get(ranked[min(target, len(ranked) - 1)], np.nan)
    return zscore(np.array(raw))


def example_loss(prompts: RequestPrompts, model: Any, examples: list[Example], split: Split, listwise: bool,
                 beta: Any = None) -> Any:
    """Mean loss of a batch of examples (listwise CE over letters / pointwise BCE on Yes-No), on the
    prompts the stage serves (``prompts``).

    ``beta`` (a scalar tensor, residual training): the listwise logits are
    ``letters + beta * example.prior``, so the LLM learns a correction of the coarse order.
    """
    import torch  # lazy: heavy (torch)
    import torch.nn.functional as F  # lazy: heavy (torch)

    pad = pad_token_id(prompts.builder.tok)
    losses = []
    for ex in examples:
        parts = prompts.build(split.request(ex.user_idx, ex.history, k=1), ex.candidates)
        logits = answer_logits(model, [parts.prefix + s for s in parts.suffixes], pad)
        if listwise:
            letters = logits[0, prompts.builder.letter_ids[: len(ex.candidates)]]
            if beta is not None:
                if ex.prior is None:
                    raise ValueError("residual training needs examples with a prior (listwise build_examples)")
                letters = letters + beta * torch.as_tensor(ex.prior, dtype=letters.dtype)
            losses.append(F.cross_entropy(letters.unsqueeze(0), torch.tensor([ex.target])))
        else:
            yes, no = prompts.builder.yes_no
            labels = torch.zeros(len(ex.candidates))
            labels[ex.target] = 1.0
            losses.append(F.binary_cross_entropy_with_logits(logits[:, yes] - logits[:, no], labels))
    return torch.stack(losses).mean()


def train_llm(split: Split, candidate_stage: Stage, llm_cfg: LLMConfig, artifact_dir: Path | str, *,
              artifacts_root: Path, seed: int, adapt: AdaptConfig | None = None,
              progress: bool = True) -> dict[str, Any]:
    """Fine-tune the base LLM with LoRA on ``split``'s train part; write the merged model.

    ``candidate_stage`` is the cascade cut the stage re-ranks (recall -> coarse), built by the
    caller (``jobs.train``); packaged backbones are converted under ``artifacts_root``/models.
    Called by ``recsys train llm``; returns a report (steps, wall time, losses, paths).
    """
    cfg = adapt or llm_cfg.adapt
    listwise = llm_cfg.scoring == "listwise"
    if cfg.residual and not listwise:
        raise ValueError("llm.adapt.residual needs llm.scoring 'listwise' (it corrects the letter logits)")
    out_dir = Path(artifact_dir) / "llm"
    t0 = time.perf_counter()
    base = resolve_model(llm_cfg, Path(artifacts_root))
    model, tokenizer = load_model(base, "fp32", llm_cfg.threads)
    # the prompts the stage serves from this artifact directory (LLMRerankStage.load)
    llm_cfg = llm_cfg.model_copy(update={"domain": prepared_item_noun(Path(artifact_dir), llm_cfg.domain)})
    prompts = RequestPrompts.for_config(PromptBuilder.for_config(tokenizer, llm_cfg),
                                        item_labels(split.items, llm_cfg), llm_cfg)
    n_cands = min(cfg.candidates, llm_cfg.candidates) if listwise else cfg.negatives + 1
    examples = build_examples(split, candidate_stage, n_users=cfg.users, n_candidates=n_cands,
                              listwise=listwise, seed=seed, keep_order=cfg.keep_candidate_order,
                              positives=cfg.positives, valid_share=cfg.valid_share)
    schedule = _schedule(len(examples), cfg, seed)
    model = attach_lora(model, LoraSpec(cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout, tuple(cfg.target_modules)))
    prior_fit = fit_prior_beta(examples) if cfg.residual else None
    run = _optimiser(model, cfg, prior_fit, out_dir / "checkpoints")
    start = resume(run.checkpoints, model, run.optim)
    bar = progress_bar(range(start, len(schedule)), desc="llm adapt", enabled=progress, initial=start,
                       total=len(schedule))
    if prior_fit is not None:
        bar.write(f"coarse order alone: loss {prior_fit['loss']:.3f} at beta {prior_fit['beta']:.2f} "
                  f"(uniform {prior_fit['uniform_loss']:.3f}); the adapter has to get below it")
    autocast = native_bf16() if cfg.autocast_bf16 is None else cfg.autocast_bf16
    losses = run_steps(
        run.optim, schedule,
        lambda _, step: example_loss(prompts, model, [examples[i] for i in step], split, listwise, run.beta),
        desc="llm adapt", autocast=autocast, start=start, model=model, checkpoints=run.checkpoints, bar=bar,
        before_step=lambda step: _seed_step(seed + step))  # LoRA dropout masks reproducible across resumes
    train_s = time.perf_counter() - t0
    merged = model.merge_and_unload()
    report = {"base": base, "scoring": llm_cfg.scoring, "examples": len(examples), "steps": len(schedule),
              "resumed_from": start, "steps_run": len(schedule) - start, "losses": losses,
              "wall_s": train_s, "adapt": cfg.model_dump(), "autocast_bf16": autocast, "out_dir": str(out_dir),
              "residual_beta": float(run.beta.detach()) if run.beta is not None else None,
              "prior_only": prior_fit,
              "valid_users": (llm_valid_users(split.n_users, cfg.valid_share, seed).tolist()
                              if cfg.positives == "valid" else [])}
    _save_merged(merged, tokenizer, out_dir, report)
    return report


@dataclass(frozen=True)
class _Run:
    """The optimiser of one adaptation, its learnt ``beta`` (residual training) and its checkpoints."""

    optim: Any
    beta: Any
    checkpoints: Checkpoints


def _optimiser(model: Any, cfg: AdaptConfig, prior_fit: dict[str, float] | None, ckpt_dir: Path) -> _Run:
    """AdamW over the adapter and, in residual training, ``beta`` started from ``prior_fit``."""
    import torch  # lazy: heavy (torch)

    beta = torch.nn.Parameter(torch.tensor(prior_fit["beta"])) if prior_fit else None
    groups: list[dict[str, Any]] = [{"params": [p for p in model.parameters() if p.requires_grad]}]
    if beta is not None:  # one scalar: a faster rate than the adapter's, no decay
        groups.append({"params": [beta], "lr": BETA_LR, "weight_decay": 0.0})
    optim = torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay)
    checkpoints = Checkpoints(ckpt_dir, cfg.checkpoint_every, extra={"beta": beta},
                              mismatch="checkpoint and llm.adapt.residual disagree")
    return _Run(optim, beta, checkpoints)


def _seed_step(seed: int) -> None:
    import torch  # lazy: heavy (torch)

    torch.manual_seed(seed)


BETA_LR = 1e-2


def fit_prior_beta(examples: list[Example]) -> dict[str, float]:
    """The ``beta`` minimising the listwise loss of ``softmax(beta * prior)`` alone (no LLM).

    Residual training starts from it, so the adapter starts from the incoming order instead of
    having to learn it; ``loss`` is that order's own loss, the bar the LLM has to get under.
    """
    pairs = [(ex.prior, ex.target) for ex in examples if ex.prior is not None]
    if not pairs:
        raise ValueError("fit_prior_beta: no example has a prior (residual training needs listwise examples)")

    def loss(b: float) -> float:
        return float(np.mean([np.logaddexp.reduce(b * p) - b * p[t] for p, t in pairs]))

    grid = np.linspace(0.0, 8.0, 81)
    losses = [loss(b) for b in grid]
    best = int(np.argmin(losses))
    return {"beta": float(grid[best]), "loss": losses[best], "uniform_loss": losses[0]}


def _schedule(n_examples: int, cfg: AdaptConfig, seed: int) -> list[list[int]]:
    """Example indices per optimizer step: a seeded shuffle per epoch, cut to ``max_steps``."""
    rng = np.random.default_rng(seed)
    steps: list[list[int]] = []
    for _ in range(cfg.epochs):
        order = rng.permutation(n_examples)
        steps += [order[i : i + cfg.batch_size].tolist() for i in range(0, n_examples, cfg.batch_size)]
    return steps[: cfg.max_steps] if cfg.max_steps is not None else steps


def _save_merged(model: Any, tokenizer: Any, out_dir: Path, report: dict[str, Any]) -> None:
    """Write the merged model into ``out_dir``; config.json moves last (it marks completeness)."""
    tmp = out_dir / ".merged.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / TRAIN_META).write_text(json.dumps(report, indent=2, default=str))
    (out_dir / "config.json").unlink(missing_ok=True)
    for f in sorted(tmp.iterdir(), key=lambda p: p.name == "config.json"):
        f.replace(out_dir / f.name)
    tmp.rmdir()
