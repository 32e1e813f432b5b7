"""What a training run says about its two-tower fits: a summary per fit and the warnings a user needs.

``fit_summary`` keeps, per two-tower stage of a ``jobs.train.train_stages`` report, the epochs, the
best epoch, what stopped the fit and the training settings it used (each value with why: scaled to
the data or set); ``training_warnings`` says when a fit was stopped by the wall-clock cap (the model
then depends on the machine's load) or by a budget (the epoch bound, the opt-in logit budget) before
early stopping (not converged); ``served_choices`` says what the training gates chose for the served
cascade. ``recsys eval`` and ``eval --seeds`` put all three in their reports.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cascade.registry import weights_key
from cascade.settings import Settings
from fusion.stage import WEIGHTS_FILE

FIT_FIELDS = ("train_s", "epochs", "best_epoch", "stopped_by", "converged", "out_of_budget", "out_of_time",
              "settings", "channels", "refit")


def fit_summary(report: dict[str, Any]) -> dict[str, Any]:
    """The two-tower fits of a ``train_stages`` report: epochs, best epoch, what stopped them, channels."""
    return {k: {f: report[k].get(f) for f in FIT_FIELDS} for k in ("recall", "recall_holdout") if k in report}


def training_warnings(settings: Settings, report: dict[str, Any]) -> list[str]:
    """What in a ``train_stages`` report a user should know about the two-tower fits:

    - the wall-clock safety cap (``recall.max_train_s``) stopped a fit: the same seed then gives
      another model on a slower or busier machine (measured under the old 240 s cap: on ML-100K
      without item text, 14 epochs and valid NDCG@10 0.071 on a shared box against 47 epochs and
      0.106 on a quiet one);
    - a budget stopped a fit before early stopping did: the epoch bound (``recall.max_epochs``, scaled
      to the data when unset) or the opt-in logit budget (``recall.max_train_logits``), named by the
      report's ``stopped_by``: deterministic, but not converged (said more strongly when its last
      evaluation was its best).
    """
    out = []
    recall = settings.recall
    cap = "unset" if recall.max_train_s is None else f"{recall.max_train_s:g} s"
    for stage in ("recall", "recall_holdout"):
        rep = report.get(stage) or {}
        if rep.get("out_of_time"):
            out.append(f"{stage}: the wall-clock cap recall.max_train_s ({cap}) stopped the "
                       f"two-tower at epoch {rep.get('epochs')}, before its logit budget; the result depends on this "
                       "machine's speed and load (raise recall.max_train_s for a reproducible model)")
        elif rep.get("out_of_budget"):
            how = ("while it was still improving" if rep.get("best_epoch") == rep.get("epochs")
                   else f"before early stopping (best epoch {rep.get('best_epoch')})")
            if rep.get("stopped_by") == "max_epochs":
                bound = (rep.get("settings") or {}).get("max_epochs", str(recall.max_epochs))
                what = f"the epoch bound recall.max_epochs ({bound})"
            else:
                logits = "unset" if recall.max_train_logits is None else f"{recall.max_train_logits:g}"
                what = f"the logit budget recall.max_train_logits ({logits})"
            out.append(f"{stage}: {what} stopped the two-tower at epoch {rep.get('epochs')} {how}: not converged "
                       "(raise it for a converged model)")
        if (rep.get("refit") or {}).get("out_of_time"):  # the refit has its own clock (recall.train._refit)
            out.append(f"{stage}: the wall-clock cap recall.max_train_s ({cap}) stopped the refit "
                       f"at epoch {rep['refit'].get('epochs')} of {rep.get('best_epoch')}; the served model depends on "
                       "this machine's speed and load (raise recall.max_train_s for a reproducible model)")
    return out


def served_choices(settings: Settings, artifact_dir: Path) -> dict[str, Any]:
    """What the training gates chose for the cascade in ``artifact_dir``, read from the files it serves
    (so a reused stage reports what it was trained with): the coarse ranker's cold-item training, new-item
    placement, LLM columns and ensemble size (``coarse/meta.json``), and the fusion weights with the
    gate's verdict (``fusion/<key>/weights.json``). A stage without its files is left out."""
    out: dict[str, Any] = {}
    meta = Path(artifact_dir) / "coarse" / "meta.json"
    if meta.is_file():
        report = json.loads(meta.read_text()).get("report", {})
        out["coarse"] = {"cold_item_training": report.get("cold_item_dropout", {}).get("chosen"),
                         "new_items": report.get("new_items", {}).get("chosen"),
                         "llm_columns": report.get("llm_embedding_features", {}).get("chosen"),
                         "ensemble": report.get("ensemble", {}).get("fits", 1)}
    weights = Path(artifact_dir) / "fusion" / weights_key(settings) / WEIGHTS_FILE
    if weights.is_file():
        tuned = json.loads(weights.read_text())
        check = tuned.get("mixture_check", {})
        out["fusion"] = {"weights": tuned.get("weights"), "kept": check.get("kept"),
                         **{k: check[k] for k in ("challenger", "mean", "ci95") if k in check}}
    return out
