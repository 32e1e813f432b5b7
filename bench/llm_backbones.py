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
  order fused with the probe (and with the zero-shot score) by ``fusion.stage``'s rank-linear rule
  (the weight chosen on one half of the users and measured on the other, both ways: no user scores
  a weight picked on itself), with a paired-bootstrap 95% CI of each against the stage order.
  ``valid_users`` measures a random subsample instead (seeded; the report says which).
- **likelihood / PMI**: each candidate scored by the log-likelihood of its title after the
  user's prompt (the backbone's own belief of what comes next), and that minus the title's
  likelihood after the same frame with no history (PMI: the popularity prior taken out); both
  also fused with the stage order like the probe.
- **cost**: per valid request, the prefix pass (a cold prefix) and the candidate passes (all a
  request with a warm prefix pays), p50/p99 in ms, fp32 on the configured threads.

``model`` may be a packaged backbone name (``llm_rerank.packaged_backbones``), converted on first use.

A backbone whose probe does not beat the random expectation has no item knowledge for
adaptation to unlock, and fusion cannot use it. The test split is never read.

Deliberately left out: gradient adaptation (``llm_rerank.adapt``) and serving the probe (the stage
scores from the LM head's own logits).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cascade.settings import Settings
from fusion.stage import rank_normalise
from jobs.evaluation.llm_cases import candidate_source, make_stage, set_threads, torch_threads
from llm_rerank.backbone import resolve_model
from llm_rerank.forward import run_prefix, suffix_hidden
from offline.bootstrap import paired_bootstrap
from offline.metrics import ndcg_at_ranks, random_ndcg
from offline.split import Split
from recsys.progress import progress_bar

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
    title_loglik: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [rows] log P(title | user's prompt)
    title_prior: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [rows] log P(title | no history)
    cost_ms: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))  # [requests, (prefix, candidates)]
    tokens: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [requests] prompt tokens


def _suffix_pass(model: Any, prefix: Any, suffixes: Sequence[Sequence[int]], slots: Sequence[Any],
                 pad_id: int) -> tuple[Any, Any]:
    """(answer-position states [B, H], summed log-probability of each suffix's title tokens [B]).

    One decoder pass over the suffixes continuing the cached prefix; the LM head runs only on the
    positions that predict a title token (Gemma 3's 262k vocabulary makes the full head costly).
    """
    import torch  # lazy: heavy (torch)

    hidden, last, ids = suffix_hidden(model, prefix, suffixes, pad_id)
    head = model.get_output_embeddings()
    rows, cols, targets = [], [], []
    for b, spans in enumerate(slots):
        start, end = spans[0]
        for t in range(start, end):  # position t - 1 predicts token t (start >= 1: the opener comes first)
            rows.append(b)
            cols.append(t - 1)
            targets.append(int(ids[b, t]))
    loglik = torch.zeros(len(suffixes))
    if rows:
        logp = torch.log_softmax(head(hidden[rows, cols]).float(), dim=-1)
        picked = logp[torch.arange(len(rows)), torch.tensor(targets)]
        loglik.index_add_(0, torch.tensor(rows), picked)
    return hidden[torch.arange(len(suffixes)), last], loglik


def collect(stage: Any, cases: Sequence[tuple[Any, np.ndarray, int]], progress: bool = True,
            desc: str = "probe", prior: dict[int, float] | None = None) -> ProbeData:
    """Run each (request, candidates in stage order, held item) through the pointwise prompt.

    Besides the answer-position state and the zero-shot ``logit(Yes) - logit(No)``, each row gets
    the log-likelihood of the candidate's title after the user's prompt and, once per item (kept in
    ``prior`` across calls), after the same frame with no history: their difference is the PMI
    score, the likelihood with each title's popularity prior taken out. ``prior=None`` skips the
    priors (the probe's train requests need only the states).
    """
    import torch  # lazy: heavy (torch)

    local = stage.local()
    model, pad_id, prompts = local.model, local.pad_id, stage.prompts
    yes, no = prompts.yes_no
    head = model.get_output_embeddings()
    priors = prior
    bs = stage.cfg.batch_size
    states, zero, label, group, position, cost, tokens, loglik = [], [], [], [], [], [], [], []
    empty_prefix: Any = None
    for g, (request, items, held) in enumerate(progress_bar(cases, desc=desc, enabled=progress, unit="user")):
        parts = stage.build_prompt(request, items)
        with torch.inference_mode():
            t0 = time.perf_counter()
            prefix = run_prefix(model, parts.prefix)
            t1 = time.perf_counter()
            h, ll = [], []
            for i in range(0, len(parts.suffixes), bs):
                a, b = _suffix_pass(model, prefix, parts.suffixes[i : i + bs], parts.slots[i : i + bs],
                                    pad_id)
                h.append(a)
                ll.append(b)
            hs = torch.cat(h)
            logits = head(hs).float()  # the LM head on the answer positions only (Gemma 3: 262k vocabulary)
            cost.append(((t1 - t0) * 1000, (time.perf_counter() - t1) * 1000))
            tokens.append(len(parts.prefix) + sum(len(x) for x in parts.suffixes))
            todo = [] if priors is None else [j for j, i in enumerate(items) if int(i) not in priors]
            if todo:  # the title's prior: same frame, no history, no user attributes
                bare = stage.build_prompt(replace_history(request), items[todo])
                if empty_prefix is None:
                    empty_prefix = run_prefix(model, bare.prefix)
                for i in range(0, len(todo), bs):
                    _, b = _suffix_pass(model, empty_prefix, bare.suffixes[i : i + bs], bare.slots[i : i + bs],
                                        pad_id)
                    for j, v in zip(todo[i : i + bs], b.tolist(), strict=True):
                        priors[int(items[j])] = float(v)  # type: ignore[index]
        states.append(hs.float().numpy())
        zero.append((logits[:, yes] - logits[:, no]).numpy())
        loglik.append(torch.cat(ll).numpy())
        label.append((np.asarray(items) == held).astype(np.int8))
        group.append(np.full(len(items), g))
        position.append(np.arange(len(items)))
    if not states:
        raise ValueError("llm probe: no request to collect (no eligible user)")
    all_items = np.concatenate([np.asarray(c[1]) for c in cases])
    return ProbeData(np.concatenate(states), np.concatenate(zero), np.concatenate(label),
                     np.concatenate(group), np.concatenate(position), np.concatenate(loglik).astype(np.float64),
                     np.array([priors[int(i)] if priors is not None else np.nan for i in all_items]),
                     np.asarray(cost), np.asarray(tokens))


def replace_history(request: Any) -> Any:
    """``request`` with no history and no user attributes (the frame a title's prior is read in)."""
    return dataclasses.replace(request, history=request.history[:0], user_attrs={})


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
    from sklearn.linear_model import LogisticRegression  # lazy: heavy (sklearn imports scipy)
    from sklearn.pipeline import make_pipeline  # lazy: heavy (sklearn imports scipy)
    from sklearn.preprocessing import StandardScaler  # lazy: heavy (sklearn imports scipy)

    if train.label.min() == train.label.max():
        raise ValueError("llm probe: the training requests need both held and other items")
    model = make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=3000, random_state=seed))
    model.fit(centre(train.states, train.group), train.label)
    return lambda data: np.asarray(model.decision_function(centre(data.states, data.group)), dtype=np.float64)


def per_request_ndcg(data: ProbeData, scores: np.ndarray, k: int = K) -> np.ndarray:
    """NDCG@k of the held item (0 when absent) per request, ranking rows by ``scores`` (ties: stage order).

    A request with several held rows counts its first (lowest row index) as the target.
    """
    order = np.lexsort((data.position, -scores, data.group))  # by request, then score, then stage order
    by_group = data.group[order]
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order)) - np.searchsorted(by_group, by_group)  # 0-based within the request
    held = np.flatnonzero(data.label == 1)
    first = held[np.unique(data.group[held], return_index=True)[1]]
    ranks = np.full(int(data.group.max()) + 1, -1, dtype=np.int64)
    ranks[data.group[first]] = rank[first]
    return ndcg_at_ranks(ranks, k)


def random_expectation(data: ProbeData, k: int = K) -> np.ndarray:
    """Expected NDCG@k per request when its candidates are shuffled uniformly (0 without a held item)."""
    n = int(data.group.max()) + 1
    has_held = np.bincount(data.group[data.label != 0], minlength=n) > 0
    return np.where(has_held, random_ndcg(np.bincount(data.group, minlength=n), k), 0.0)


def fused_scores(data: ProbeData, probe: np.ndarray, weight: float) -> np.ndarray:
    """``fusion.stage`` rank-linear fusion of the stage order (1 - weight) and the probe (weight)."""
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


def probe_backbone(settings: Settings, artifact_dir: Path, *, model: str | None = None, train_users: int = 800,
                   valid_users: int | None = None, candidates: int | None = None, c: float = 0.01,
                   seed: int = 0, min_history: int = 5, held_only: bool = False,
                   progress: bool = True) -> dict[str, Any]:
    """The whole check (see the module doc); returns the JSON report.

    ``held_only`` measures only valid users whose held item is among the candidates (the others
    score 0 under every order, so they add cost and no contrast); the report gives the share of
    such users, by which the NDCGs scale back to all users.
    """
    from scipy.stats import spearmanr  # lazy: heavy (scipy)

    t0 = time.perf_counter()
    split = Split.load(artifact_dir / "split")
    n_cands = candidates or settings.llm.candidates
    if n_cands < 2:
        raise ValueError(f"llm probe: candidates must be >= 2, got {n_cands}")
    llm = settings.llm.with_overrides({"model": model}) if model else settings.llm
    location = resolve_model(llm, Path(settings.artifacts_dir))  # a packaged backbone name, a directory or a hub id
    candidates_for, source = candidate_source(split, artifact_dir, settings, "valid")
    valid_cases, pool, held_in = _valid_cases(split, candidates_for, n_cands, held_only, valid_users, seed)
    stage = make_stage(settings, artifact_dir, model=location, use_adapted=False, scoring="pointwise", precision="fp32",
                       kv={"enabled": False}, batching={"enabled": False}, backend="local")
    set_threads(settings.llm.threads)
    train = collect(stage, train_cases(split, candidates_for, train_users, n_cands, seed, min_history), progress,
                    "probe train")
    valid = collect(stage, valid_cases, progress, "probe valid", prior={})
    probe = fit_probe(train, c, seed)(valid)
    pmi = valid.title_loglik - valid.title_prior
    stage_order = per_request_ndcg(valid, -valid.position.astype(np.float64))
    scores = {"zero_shot": valid.zero_shot, "probe": probe, "likelihood": valid.title_loglik, "pmi": pmi,
              "popularity": split.item_popularity("valid")[np.concatenate([c[1] for c in valid_cases])].astype(np.float64)}
    rows, weights = _orders(valid, scores, stage_order, seed)
    vs_stage, vs_random = _versus(rows, scores, seed)
    pop = scores["popularity"]
    return {"model": location, "candidates_from": source, "candidates": n_cands,
            "train_requests": int(train.group.max()) + 1, "valid_users": len(valid_cases),
            "valid_sample": {"users": len(valid_cases), "of": pool, "seed": seed,
                             "random": len(valid_cases) < pool, "held_only": held_only},
            "held_in_candidates_share": round(held_in / split.n_users, 5),
            "valid_held_in_candidates": int(sum(valid.label[valid.group == g].any() for g in np.unique(valid.group))),
            "ndcg@10": {name: round(float(v.mean()), 5) for name, v in rows.items()},
            "vs_stage_order": vs_stage, "vs_random": vs_random,
            "fusion_weight_per_half": weights,
            "spearman_vs_popularity": {n: round(float(spearmanr(scores[n], pop).statistic), 4)
                                       for n in ("zero_shot", "probe", "likelihood", "pmi")},
            "cost_per_request": {**request_cost(valid), "threads": torch_threads()}, "c": c,
            "seconds": round(time.perf_counter() - t0, 1)}



def _valid_cases(split: Split, candidates_for: Callable[[int, np.ndarray], tuple[Any, np.ndarray]], n_cands: int,
                 held_only: bool, valid_users: int | None, seed: int
                 ) -> tuple[list[tuple[Any, np.ndarray, int]], int, int]:
    """(the valid users' cases measured, how many were eligible, how many users' held item is among
    the candidates). Candidates come first (cheap, no LLM): ``held_only`` needs them to draw users."""
    cases, held_in = [], 0
    for u in range(split.n_users):
        request, items = candidates_for(u, split.history(u, "valid"))
        items = np.asarray(items[:n_cands], dtype=np.int64)
        held = int(split.valid[u])
        held_in += int(held in set(items.tolist()))
        if not held_only or held in set(items.tolist()):
            cases.append((request, items, held))
    pool = len(cases)
    if valid_users is not None and valid_users < pool:
        pick = np.sort(np.random.default_rng([seed, 0x9B2]).choice(pool, valid_users, replace=False))
        cases = [cases[i] for i in pick]
    return cases, pool, held_in


def _orders(valid: ProbeData, scores: dict[str, np.ndarray], stage_order: np.ndarray, seed: int
            ) -> tuple[dict[str, np.ndarray], dict[str, list[float]]]:
    """Per-request NDCG@10 of every order (the stage's, random, each score alone, the stage fused with
    each LLM score) and the fusion weight fitted on each half."""
    rows: dict[str, np.ndarray] = {"stage_order": stage_order, "random": random_expectation(valid)}
    weights: dict[str, list[float]] = {}
    for name, score in scores.items():
        rows[name] = per_request_ndcg(valid, score)
    for name in ("zero_shot", "probe", "likelihood", "pmi"):
        rows[f"stage+{name}"], weights[name] = cross_fitted_fusion(valid, scores[name], seed)
    return rows, weights


def _versus(rows: dict[str, np.ndarray], scores: dict[str, np.ndarray], seed: int
            ) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """Each order against the stage's own and each score alone against random: paired bootstrap CIs."""
    vs_stage, vs_random = {}, {}
    for name, v in rows.items():
        if name != "stage_order":
            boot = paired_bootstrap(rows["stage_order"], v, n_boot=2000, seed=seed)
            vs_stage[name] = {"mean": round(boot["mean"], 5), "ci95": [round(x, 5) for x in boot["ci95"]]}
        if name in scores:
            boot = paired_bootstrap(rows["random"], v, n_boot=2000, seed=seed)
            vs_random[name] = {"mean": round(boot["mean"], 5), "ci95": [round(x, 5) for x in boot["ci95"]]}
    return vs_stage, vs_random


def compare(reports: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per backbone: NDCG@10 of each scorer and of the stage fused with it, CI vs the stage
    order, and the cost per request (the side-by-side table of ``recsys bench llm-probe``)."""
    table = []
    for name, r in reports.items():
        row: dict[str, Any] = {"backbone": name, "stage_order": r["ndcg@10"]["stage_order"],
                               "random": r["ndcg@10"]["random"]}
        for key in ("zero_shot", "likelihood", "pmi", "probe", "stage+zero_shot", "stage+likelihood",
                    "stage+pmi", "stage+probe"):
            row[key] = {"ndcg@10": r["ndcg@10"][key], "vs_stage": r["vs_stage_order"][key]["ci95"],
                        **({"vs_random": r["vs_random"][key]["ci95"]} if key in r["vs_random"] else {})}
        cost = r["cost_per_request"]
        row["cold_ms_p50_p99"] = [cost["cold_prefix_ms"]["p50"], cost["cold_prefix_ms"]["p99"]]
        row["warm_ms_p50_p99"] = [cost["warm_prefix_ms"]["p50"], cost["warm_prefix_ms"]["p99"]]
        row["users"] = r["valid_users"]
        table.append(row)
    return table
