"""Backbone signal check (``recsys bench llm-probe``): can this LLM see who will watch what at all?

LoRA adaptation costs ~20 minutes on 2 cores and its result mixes two things: what the backbone
already knows about the items and what a few hundred steps can teach it. This check answers
the prior question cheaply, with forward passes only: does the state the pointwise prompt ends
on (the final hidden state at the answer position, after the last norm: what the LM head reads)
separate the user's next item from the candidate stage's other top items?

- **train**: ``train_users`` users of the train split, each cut at a random point of their train
  sequence (history = the items before it, positive = the item at it), candidates = the
  candidate stage's top ``candidates`` for that history. A logistic-regression probe
  (scikit-learn, L2 strength ``c``) is fitted on the states, centred per request (only
  differences within a request matter to a ranking) and standardised.
- **valid**: every user with their valid item, the input the cascade serves (history = the
  whole train sequence), candidates = the stage's top ``candidates``. Reported per user and
  averaged: NDCG@10 among those candidates of the stage's own order, the backbone zero-shot
  (``P(Yes)``, the TALLRec score), the probe, the expectation of a random order, and the stage
  order fused with the probe (and with the zero-shot score) by ``recsys.fusion``'s rank-linear rule
  (the weight chosen on one half of the users and measured on the other, both ways: no user scores
  a weight picked on itself), with a paired-bootstrap 95% CI of each against the stage order.
  ``valid_users`` measures a random subsample instead (seeded; the report says which).
- **cost**: per valid request, the prefix pass (a cold prefix) and the candidate passes (all a
  request with a warm prefix pays), p50/p99 in ms, fp32 on the configured threads.

``model`` may be a catalogue name (``llm_rerank.catalogue``), converted on first use.

A backbone whose probe does not beat the random expectation has no item knowledge for
adaptation to unlock, and fusion cannot use it. The test split is never read.

Deliberately left out: gradient adaptation (``llm_rerank.adapt``) and serving the probe (the stage
scores from the LM head's own logits).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

K = 10
FUSION_WEIGHTS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)  # the probe's share; the stage order keeps the rest


@dataclass
class ProbeData:
    """Answer-position states of many requests, stacked: row i belongs to request ``group[i]``."""

    states: np.ndarray  # [rows, hidden] float32
    zero_shot: np.ndarray  # [rows] logit(Yes) - logit(No)
    label: np.ndarray  # [rows] 1 = the held item
    group: np.ndarray  # [rows] request index
    position: np.ndarray  # [rows] rank in the candidate stage's order (0 = first)
    cost_ms: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))  # [requests, (prefix, candidates)]
    tokens: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [requests] prompt tokens


def collect(stage: Any, cases: Sequence[tuple[Any, np.ndarray, int]], progress: bool = True,
            desc: str = "probe") -> ProbeData:
    """Run each (request, candidates in stage order, held item) through the pointwise prompt."""
    import torch
    from tqdm import tqdm

    from llm_rerank.scoring import run_prefix, suffix_states

    model, prompts = stage.model, stage.prompts
    yes, no = prompts.yes_no
    head = model.get_output_embeddings()
    states, zero, label, group, position, cost, tokens = [], [], [], [], [], [], []
    for g, (request, items, held) in enumerate(tqdm(cases, desc=desc, disable=not progress, unit="user")):
        parts = stage.build_prompt(request, items)
        with torch.inference_mode():
            t0 = time.perf_counter()
            prefix = run_prefix(model, parts.prefix)
            t1 = time.perf_counter()
            h = torch.cat([suffix_states(model, prefix, parts.suffixes[i : i + stage.cfg.batch_size],
                                         stage.scorer.pad_id)
                           for i in range(0, len(parts.suffixes), stage.cfg.batch_size)])
            logits = head(h).float()  # the LM head on the answer positions only (Gemma 3: 262k vocabulary)
            cost.append(((t1 - t0) * 1000, (time.perf_counter() - t1) * 1000))
            tokens.append(len(parts.prefix) + sum(len(x) for x in parts.suffixes))
        states.append(h.float().numpy())
        zero.append((logits[:, yes] - logits[:, no]).numpy())
        label.append((np.asarray(items) == held).astype(np.int8))
        group.append(np.full(len(items), g))
        position.append(np.arange(len(items)))
    if not states:
        raise ValueError("llm probe: no request to collect (no eligible user)")
    return ProbeData(np.concatenate(states), np.concatenate(zero), np.concatenate(label),
                     np.concatenate(group), np.concatenate(position), np.asarray(cost), np.asarray(tokens))


def request_cost(data: ProbeData) -> dict[str, Any]:
    """p50/p99 ms per request with a cold prefix (prefix + candidates) and a warm one (candidates only)."""
    cold, warm = data.cost_ms.sum(axis=1), data.cost_ms[:, 1]
    return {"cold_prefix_ms": {"p50": round(float(np.percentile(cold, 50)), 1),
                               "p99": round(float(np.percentile(cold, 99)), 1)},
            "warm_prefix_ms": {"p50": round(float(np.percentile(warm, 50)), 1),
                               "p99": round(float(np.percentile(warm, 99)), 1)},
            "prompt_tokens_mean": round(float(data.tokens.mean()), 1), "requests": len(data.tokens)}


def centre(x: np.ndarray, group: np.ndarray) -> np.ndarray:
    """``x`` minus its request's mean row (groups are contiguous runs or not: any labels)."""
    _, inverse, counts = np.unique(group, return_inverse=True, return_counts=True)
    sums = np.zeros((len(counts), x.shape[1]), dtype=np.float64)
    np.add.at(sums, inverse, x)
    return (x - sums[inverse] / counts[inverse, None]).astype(np.float32)


def fit_probe(train: ProbeData, c: float = 0.01, seed: int = 0) -> Callable[[ProbeData], np.ndarray]:
    """Logistic regression on request-centred, standardised states; returns ``data -> scores``."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if train.label.min() == train.label.max():
        raise ValueError("llm probe: the training requests need both held and other items")
    model = make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=3000, random_state=seed))
    model.fit(centre(train.states, train.group), train.label)
    return lambda data: np.asarray(model.decision_function(centre(data.states, data.group)), dtype=np.float64)


def per_request_ndcg(data: ProbeData, scores: np.ndarray, k: int = K) -> np.ndarray:
    """NDCG@k of the held item (0 when absent) per request, ranking rows by ``scores`` (ties: stage order)."""
    out = np.zeros(int(data.group.max()) + 1)
    for g in np.unique(data.group):
        rows = np.flatnonzero(data.group == g)
        order = rows[np.lexsort((data.position[rows], -scores[rows]))]
        hit = np.flatnonzero(data.label[order] == 1)
        if len(hit) and hit[0] < k:
            out[g] = 1.0 / np.log2(hit[0] + 2)
    return out


def random_expectation(data: ProbeData, k: int = K) -> np.ndarray:
    """Expected NDCG@k per request when its candidates are shuffled uniformly."""
    out = np.zeros(int(data.group.max()) + 1)
    for g in np.unique(data.group):
        rows = data.group == g
        if data.label[rows].any():
            n = int(rows.sum())
            out[g] = sum(1.0 / np.log2(r + 2) for r in range(min(k, n))) / n
    return out


def fused_scores(data: ProbeData, probe: np.ndarray, weight: float) -> np.ndarray:
    """``recsys.fusion`` rank-linear fusion of the stage order (1 - weight) and the probe (weight)."""
    from recsys.fusion import rank_normalise

    out = np.zeros(len(probe))
    for g in np.unique(data.group):
        rows = np.flatnonzero(data.group == g)
        out[rows] = ((1 - weight) * rank_normalise(-data.position[rows].astype(np.float64))
                     + weight * rank_normalise(probe[rows]))
    return out


def cross_fitted_fusion(data: ProbeData, probe: np.ndarray, seed: int) -> tuple[np.ndarray, list[float]]:
    """Per-request NDCG of the fused order, each half scored with the weight best on the other half."""
    n = int(data.group.max()) + 1
    half = np.random.default_rng([seed, 0x9B0]).permutation(n) % 2
    table = np.stack([per_request_ndcg(data, fused_scores(data, probe, w)) for w in FUSION_WEIGHTS])
    out, chosen = np.zeros(n), []
    for fold in (0, 1):
        pick = int(np.argmax(table[:, half != fold].mean(axis=1)))  # best where this fold is not
        chosen.append(FUSION_WEIGHTS[pick])
        out[half == fold] = table[pick, half == fold]
    return out, chosen


def train_cases(split: Any, candidates_for: Callable[[int, np.ndarray], tuple[Any, np.ndarray]], n_users: int,
                candidates: int, seed: int, min_history: int = 5) -> list[tuple[Any, np.ndarray, int]]:
    """``n_users`` train-split users cut at a random point among their last 20 train items."""
    rng = np.random.default_rng([seed, 0x9B1])
    pool = [u for u, s in enumerate(split.train_sequences) if len(s) > min_history]
    if not pool:
        raise ValueError(f"llm probe: no user has more than {min_history} train items")
    cases = []
    for u in rng.choice(pool, size=min(n_users, len(pool)), replace=False):
        seq = split.train_sequences[int(u)]
        cut = int(rng.integers(max(min_history, len(seq) - 20), len(seq)))
        request, items = candidates_for(int(u), seq[:cut])
        pos = int(seq[cut])
        others = [int(i) for i in items if int(i) != pos][: candidates - 1]
        if others:  # the positive goes first; rows are scored independently, so its slot is irrelevant
            cases.append((request, np.array([pos, *others], dtype=np.int64), pos))
    return cases


def probe_backbone(settings: Any, artifact_dir: Path, *, model: str | None = None, train_users: int = 800,
                   valid_users: int | None = None, candidates: int | None = None, c: float = 0.01,
                   seed: int = 0, min_history: int = 5, progress: bool = True) -> dict[str, Any]:
    """The whole check (see the module doc); returns the JSON report."""
    from llm_rerank.backbone import resolve_model
    from llm_rerank.perf import _set_threads, candidate_source, make_stage
    from offline.bootstrap import paired_bootstrap
    from offline.split import Split

    t0 = time.perf_counter()
    split = Split.load(artifact_dir / "split")
    n_cands = candidates or settings.llm.candidates
    if n_cands < 2:
        raise ValueError(f"llm probe: candidates must be >= 2, got {n_cands}")
    llm = settings.llm.with_overrides({"model": model}) if model else settings.llm
    location = resolve_model(llm, Path(settings.artifacts_dir))  # a catalogue name, a directory or a hub id
    candidates_for, source = candidate_source(split, artifact_dir, settings, "valid")
    stage = make_stage(settings, artifact_dir, model=location, use_adapted=False, scoring="pointwise",
                       kv={"enabled": False}, batching={"enabled": False}, backend="local")
    _set_threads(settings.llm.threads)
    train = collect(stage, train_cases(split, candidates_for, train_users, n_cands, seed, min_history), progress, "probe train")
    users = np.arange(split.n_users)
    if valid_users is not None and valid_users < split.n_users:
        users = np.sort(np.random.default_rng([seed, 0x9B2]).choice(split.n_users, valid_users, replace=False))
    valid_cases = []
    for u in users:
        request, items = candidates_for(int(u), split.history(int(u), "valid"))
        valid_cases.append((request, np.asarray(items[:n_cands], dtype=np.int64), int(split.valid[int(u)])))
    valid = collect(stage, valid_cases, progress, "probe valid")
    probe = fit_probe(train, c, seed)(valid)
    stage_order = per_request_ndcg(valid, -valid.position.astype(np.float64))
    fused, weights = cross_fitted_fusion(valid, probe, seed)
    fused_zero, zero_weights = cross_fitted_fusion(valid, valid.zero_shot, seed)
    rows = {"stage_order": stage_order, "zero_shot": per_request_ndcg(valid, valid.zero_shot),
            "probe": per_request_ndcg(valid, probe), "random": random_expectation(valid),
            "stage+probe": fused, "stage+zero_shot": fused_zero}
    vs_stage = {}
    for name in ("zero_shot", "probe", "random", "stage+probe", "stage+zero_shot"):
        boot = paired_bootstrap(stage_order, rows[name], n_boot=2000, seed=seed)
        vs_stage[name] = {"mean": round(boot["mean"], 5), "ci95": [round(x, 5) for x in boot["ci95"]]}
    boot = paired_bootstrap(rows["random"], rows["probe"], n_boot=2000, seed=seed)
    return {"model": location, "candidates_from": source, "candidates": n_cands,
            "train_requests": int(train.group.max()) + 1, "valid_users": len(valid_cases),
            "valid_sample": {"users": len(valid_cases), "of": int(split.n_users), "seed": seed,
                             "random": len(valid_cases) < split.n_users},
            "valid_held_in_candidates": int(sum(valid.label[valid.group == g].any() for g in np.unique(valid.group))),
            "ndcg@10": {name: round(float(v.mean()), 5) for name, v in rows.items()},
            "vs_stage_order": vs_stage,
            "probe_vs_random": {"mean": round(boot["mean"], 5), "ci95": [round(x, 5) for x in boot["ci95"]]},
            "fusion_weight_per_half": weights, "zero_shot_fusion_weight_per_half": zero_weights,
            "cost_per_request": {**request_cost(valid), "threads": torch_threads()}, "c": c,
            "seconds": round(time.perf_counter() - t0, 1)}


def torch_threads() -> int:
    import torch

    return int(torch.get_num_threads())
