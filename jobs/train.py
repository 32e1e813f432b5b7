"""Offline jobs the CLI runs: prepare a dataset's split, train the cascade's stages in order.

Artifacts of one dataset live under one directory (see ``recsys.contract``):
``split/`` (the leave-one-out split), ``recall/``, ``recall_holdout/`` (a second recall
model for coarse-ranker training data), ``coarse/``, ``llm/``, ``fusion/<stages>/``.

Why a second recall model: the coarse ranker learns from recall candidates for "training
sequence before item j -> item j" for each user's last ``coarse.train_positions`` items.
Candidates from a recall model that trained on those items would carry inflated recall
scores for the labels, and LightGBM would learn to over-trust them. ``recall_holdout`` is
trained without them, so the coarse ranker's training features look like serving-time ones.

Deliberately left out: evaluation (``jobs.evaluate``), LLM adaptation (``jobs.llm_adapt``).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from cascade.registry import (
    build_pipeline,
    config_id,
    recall_config,
    recall_depth,
    serving_config_id,
    weights_key,
)
from cascade.settings import Settings
from jobs.fusion_gate import tune_fusion
from jobs.llm_adapt import train_llm
from offline.loaders import LOADER_REVISION, detect_format, load_dataset
from offline.protocol import CATALOGS, make_split, outside_users
from offline.schema import Dataset
from offline.split import Split, split_id
from recall.stage import RecallStage
from recsys.atomic import atomic_write_json, json_default
from recsys.digest import file_sha256
from recsys.manifest import MANIFEST_FILE, write_manifest
from recsys.pipeline import PipelineStage

log = logging.getLogger(__name__)

DEFAULT_K_CORE = 5
DEFAULT_CATALOG = "interacted"  # offline.protocol.CATALOGS: the k-core's items, as the published protocols rank
SYNTHETIC_DEFAULTS = {"n_users": 600, "n_items": 1200}  # the synthetic default dataset's size (CLI help)
STAGE_ORDER = ("recall", "recall_holdout", "coarse", "llm", "fusion")
DEFAULT_STAGES = ("recall", "recall_holdout", "coarse", "fusion")


def dataset_name(data: Path | None) -> str:
    return "synthetic" if data is None else Path(data).resolve().name


def _fingerprint(data: Path | None, fmt: str | None, k_core: int, synthetic: dict[str, Any],
                 catalog: str = DEFAULT_CATALOG) -> dict[str, Any]:
    """What the split depends on: file names, sizes and content digests (never paths or mtimes).

    A dataset copied, restored or reached through another path keeps its fingerprint, so its
    split and every stage trained on it are reused; any changed byte makes a new split.
    """
    files = {}
    if data is not None:
        for f in sorted(Path(data).iterdir()):
            if f.is_file():
                files[f.name] = [f.stat().st_size, file_sha256(f)[:20]]
    return {"data": dataset_name(data), "format": fmt, "k_core": k_core,
            "synthetic": synthetic if data is None else {}, "files": files,
            # only when not the default: a split prepared before the option keeps its fingerprint
            **({"catalog": catalog} if catalog != DEFAULT_CATALOG else {}),
            **({"loader_revision": LOADER_REVISION} if data is not None else {})}


def recorded_source(artifact_dir: Path) -> dict[str, Any]:
    """What the split under ``artifact_dir`` was prepared from (``_fingerprint``); {} when none,
    or when the file is not such a record (unreadable, or not an object of the right types)."""
    path = Path(artifact_dir) / "split" / "source.json"
    try:
        src = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        return {}
    typed = (isinstance(src, dict) and isinstance(src.get("files", {}), dict)
             and isinstance(src.get("synthetic", {}), dict) and isinstance(src.get("data", ""), str)
             and isinstance(src.get("k_core", 1), int) and not isinstance(src.get("k_core"), bool)
             and (src.get("format") is None or isinstance(src["format"], str))
             and src.get("catalog", DEFAULT_CATALOG) in CATALOGS)
    return src if typed else {}


def same_dataset(recorded: dict[str, Any], data: Path | None) -> bool:
    """Whether ``recorded`` (``recorded_source``) was prepared from ``data``: the same files (names,
    sizes, content digests) whatever the directory is called or where it lies; the synthetic set
    when ``data`` is None."""
    if not recorded:
        return False
    if data is None:
        return recorded.get("data") == "synthetic" and not recorded.get("files")
    return bool(recorded.get("files")) and recorded.get("files") == _fingerprint(data, None, 0, {})["files"]


def prepare(
    data: Path | None, artifact_dir: Path, *, fmt: str | None = None, k_core: int | None = None,
    catalog: str | None = None, force: bool = False, **synthetic: Any,
) -> Split:
    """Load the dataset, split it with the protocol and save it (reused when inputs are unchanged).

    ``k_core`` and ``catalog`` (``offline.protocol.make_split``) left None keep the values the
    split already under ``artifact_dir`` was prepared with, whatever dataset it was prepared
    from (a shop's next export, in a directory of another name too), until given otherwise;
    ``fmt`` and the synthetic ``n_users``/``n_items`` left None keep theirs only for the same
    dataset (``same_dataset``; for ``fmt`` also a refresh of it, ``same_name``: other files);
    else the defaults (5-core, the interacted catalog, the detected layout, 600 x 1200). A format
    given that is the one detected counts as not given. A rebuild over a split prepared
    otherwise logs a ``note:`` warning naming what changed and the options kept without being
    given, once the new split is saved.
    """
    split_dir = Path(artifact_dir) / "split"
    before = recorded_source(artifact_dir)
    same = same_dataset(before, data)
    fmt, k_core, catalog, inherited = _options(before, data, same, fmt, k_core, catalog)
    synthetic = {key: v for key, v in synthetic.items() if v is not None}
    if data is None:
        for key, default in SYNTHETIC_DEFAULTS.items():
            synthetic.setdefault(key, before.get("synthetic", {}).get(key, default) if same else default)
    fp = _fingerprint(data, fmt, k_core, synthetic, catalog)
    if not force and before == fp:
        split = Split.load(split_dir)
        if split.outside is None:  # saved before the outside users were kept: add them, same split id
            split.outside = outside_users(load_dataset(data, fmt, **synthetic), split.users["user_id"],
                                          split.items["item_id"])
            split.save_outside(split_dir)
        return split
    ds = load_dataset(data, fmt, **synthetic)
    split = make_split(ds, k_core=k_core, catalog=catalog)
    # the old fingerprint goes before the split is rewritten: an interrupted prepare leaves no
    # split (the next one starts over), never a fingerprint vouching for half-new files
    (split_dir / "source.json").unlink(missing_ok=True)
    split.save(split_dir)
    atomic_write_json(split_dir / "source.json", fp)
    if before and (changed := _changes(before, fp, same, inherited)):
        log.warning("note: %s: the split was rebuilt (%s); stages trained on the old one retrain",
                    artifact_dir, ", ".join(changed))
    if left_out := catalog_left_out(ds, split):
        log.warning("note: %s", left_out)
    return split


def catalog_left_out(ds: Dataset, split: Split) -> str:
    """What the k-core left out of the catalog, in words ("" when nothing): such items are
    never recommended, and a listed item's content does not bring it back.

    >>> from types import SimpleNamespace
    >>> import pandas as pd
    >>> log = pd.DataFrame({"user_id": ["u"] * 3, "item_id": ["a", "a", "b"], "rating": 1.0, "timestamp": 1})
    >>> ds = Dataset("d", log, pd.DataFrame({"item_id": ["a", "b", "c"]}), pd.DataFrame({"user_id": ["u"]}))
    >>> catalog_left_out(ds, SimpleNamespace(items=pd.DataFrame({"item_id": ["a"]}), protocol={"k_core": 2}))
    '2 of 3 listed items are left out of the catalog and are never recommended: 1 with no event (--catalog listed keeps such items, as new ones), 1 removed by the 2-core filter (--k-core sets it)'
    """
    listed = ds.items["item_id"]
    out = listed.loc[~listed.isin(split.items["item_id"])]
    if out.empty:
        return ""
    k = split.protocol["k_core"]
    none = int((~out.isin(ds.interactions["item_id"])).sum())
    hint = " (--catalog listed keeps such items, as new ones)" if none else ""
    return (f"{len(out):,} of {len(listed):,} listed items are left out of the catalog and are never recommended: "
            f"{none:,} with no event{hint}, {len(out) - none:,} removed by the {k}-core filter (--k-core sets it)")


def same_name(recorded: dict[str, Any], data: Path | None) -> bool:
    """Whether ``data`` is a directory of the name the dataset ``recorded`` was prepared from: with
    other files, a refresh of it (``same_dataset`` is the unchanged case, and is checked first: it
    hashes every file, so it is not asked again here)."""
    return data is not None and bool(recorded.get("files")) and recorded.get("data") == dataset_name(data)


def _options(before: dict[str, Any], data: Path | None, same: bool, fmt: str | None, k_core: int | None,
             catalog: str | None) -> tuple[str | None, int, str, dict[str, Any]]:
    """``(fmt, k_core, catalog, inherited)`` for ``prepare`` (see there); ``inherited`` holds the
    options taken from the recorded split ``before`` that are not the defaults (for the note)."""
    inherited: dict[str, Any] = {}
    if fmt is None:
        if (same or same_name(before, data)) and before.get("format"):
            fmt = inherited["format"] = before["format"]
    elif data is not None and fmt == detect_format(Path(data)):
        fmt = None  # the detected layout, named: the same split as when it is not
    if k_core is None:
        k_core = int(before.get("k_core", DEFAULT_K_CORE))
        if k_core != DEFAULT_K_CORE:
            inherited["k_core"] = k_core
    if catalog is None:
        catalog = str(before.get("catalog", DEFAULT_CATALOG))
        if catalog != DEFAULT_CATALOG:
            inherited["catalog"] = catalog
    return fmt, k_core, catalog, inherited


def _changes(before: dict[str, Any], after: dict[str, Any], same: bool, inherited: dict[str, Any]) -> list[str]:
    """What differs between two fingerprints, for the rebuild note, and the options ``inherited``
    from the old split without being given (so a user who meant the defaults sees they did not apply).

    >>> _changes({"data": "a", "k_core": 5, "format": None, "synthetic": {}}, {"data": "b", "k_core": 3,
    ...          "format": None, "synthetic": {}, "catalog": "listed"}, False, {"catalog": "listed"})
    ["dataset 'a' -> 'b'", 'k_core 5 -> 3', 'catalog interacted -> listed', 'kept: catalog listed (give --catalog to change it)']
    """
    out = []
    if not same:
        out.append(f"the files of dataset {after['data']!r} changed" if before.get("data") == after["data"]
                   else f"dataset {before.get('data')!r} -> {after['data']!r}")
    out += [f"{key} {before.get(key)} -> {after[key]}" for key in ("k_core", "format") if before.get(key) != after[key]]
    if (old := before.get("catalog", DEFAULT_CATALOG)) != (new := after.get("catalog", DEFAULT_CATALOG)):
        out.append(f"catalog {old} -> {new}")
    if same and (old_rev := before.get("loader_revision", 1)) != after.get("loader_revision", old_rev):
        out.append(f"the loaders read these files differently now (revision {old_rev} -> {after['loader_revision']})")
    old_synth = before.get("synthetic", {})
    out += [f"synthetic {key} {old_synth.get(key)} -> {v}" for key, v in after["synthetic"].items()
            if old_synth.get(key) != v]
    if inherited and not same:
        opts = ", ".join(f"{key} {v}" for key, v in inherited.items())
        flags = "/".join(f"--{key.replace('_', '-')}" for key in inherited)
        out.append(f"kept: {opts} (give {flags} to change it)")
    return out


def holdout_sequences(split: Split, positions: int = 1) -> tuple[list[np.ndarray], np.ndarray]:
    """Train sequences without their last ``positions`` items, and early-stopping targets.

    The target of user u is the first held-out item (what follows the shortened sequence),
    -1 for users too short to hold anything out (their sequence stays whole so the model
    still learns from it, and they are left out of early stopping).
    """
    seqs, targets = [], np.full(split.n_users, -1, dtype=np.int64)
    for u, seq in enumerate(split.train_sequences):
        cut = min(positions, len(seq) - 1)
        if cut >= 1:
            seqs.append(seq[:-cut])
            targets[u] = seq[-cut]
        else:
            seqs.append(seq)
    return seqs, targets


def train_stages(
    settings: Settings, artifact_dir: Path, split: Split, *, stages: tuple[str, ...] = DEFAULT_STAGES,
    force: bool = False, progress: bool = True,
) -> dict[str, Any]:
    """Train ``stages`` in cascade order; a stage whose artifacts exist is reused unless ``force``."""
    unknown = set(stages) - set(STAGE_ORDER)
    if unknown:
        raise ValueError(f"unknown stage(s) to train: {sorted(unknown)}; choose from {STAGE_ORDER}")
    artifact_dir = Path(artifact_dir)
    current = split_id(artifact_dir)
    report: dict[str, Any] = {}
    for stage in (s for s in STAGE_ORDER if s in stages):
        stage_dir = _stage_dir(settings, artifact_dir, stage)
        meta = _read_meta(stage_dir)
        cid = config_id(settings, stage)
        upstream = _upstream(settings, artifact_dir, stage)
        if (not force and meta is not None and meta.get("split_id") == current
                and meta.get("config_id") == cid
                and meta.get("upstream", upstream) == upstream):  # an older stage.json has no upstream record
            _record_reused(stage_dir, meta, serving_config_id(settings, stage))
            report[stage] = {"reused": True, **meta.get("report", {})}
            continue
        # an interrupted retrain must not leave the old completion marker (or digests) vouching for half-new files
        (stage_dir / "stage.json").unlink(missing_ok=True)
        (stage_dir / MANIFEST_FILE).unlink(missing_ok=True)
        t0 = time.perf_counter()
        rep = _TRAINERS[stage](settings, artifact_dir, split, progress)
        rep["seconds"] = round(time.perf_counter() - t0, 2)
        report[stage] = rep
        _write_meta(stage_dir, rep, current, cid, upstream, serving_config_id(settings, stage))
        force = True  # a retrained stage invalidates every stage trained on its output
    return report


def _stage_dir(settings: Settings, artifact_dir: Path, stage: str) -> Path:
    """Where a stage's artifacts (and its completion marker) live; fusion has one per stage set."""
    if stage == "fusion":
        return artifact_dir / "fusion" / weights_key(settings)
    return artifact_dir / stage


def _read_meta(directory: Path) -> dict[str, Any] | None:
    path = directory / "stage.json"
    return json.loads(path.read_text()) if path.exists() else None


# the stages whose trained output a stage learns from: retraining one of them (in any command, e.g. the
# LLM probe retraining a stale coarse) makes the stages below it stale too
DEPENDS_ON = {"recall": (), "recall_holdout": (), "coarse": ("recall", "recall_holdout"),
              "llm": ("recall", "coarse"), "fusion": ("recall", "coarse", "llm")}


def _upstream(settings: Settings, artifact_dir: Path, stage: str) -> dict[str, str | None]:
    """The ``run_id`` of each trained stage ``stage`` depends on (``DEPENDS_ON``), as now on disk."""
    out: dict[str, str | None] = {}
    for dep in DEPENDS_ON[stage]:
        meta = _read_meta(_stage_dir(settings, artifact_dir, dep))
        if meta is not None:
            out[dep] = meta.get("run_id")
    return out


def _write_meta(directory: Path, report: dict[str, Any], split_id: str, config_id: str = "",
                upstream: dict[str, str | None] | None = None, serving_id: str = "") -> None:
    directory.mkdir(parents=True, exist_ok=True)
    write_manifest(directory)  # the digests every load checks (recsys.manifest), before the marker
    atomic_write_json(directory / "stage.json", {"split_id": split_id, "config_id": config_id,
                                                 "serving_config_id": serving_id,
                                                 "run_id": uuid.uuid4().hex, "upstream": upstream or {},
                                                 "report": report},
                      default=json_default)  # last write: marks the stage complete


def _record_reused(directory: Path, meta: dict[str, Any], serving_id: str) -> None:
    """What a reused stage trained before it was recorded lacks: its manifest (the files are vouched for
    as they are now, by this run) and its ``serving_config_id`` (``cascade.registry``)."""
    if not (directory / MANIFEST_FILE).exists():
        write_manifest(directory)
    if meta.get("serving_config_id") != serving_id:
        atomic_write_json(directory / "stage.json", {**meta, "serving_config_id": serving_id}, default=json_default)


def _train_recall(settings: Settings, artifact_dir: Path, split: Split, progress: bool) -> dict[str, Any]:
    from recall.train import train_two_tower  # lazy: imports torch

    return train_two_tower(split, artifact_dir / "recall", recall_config(settings), progress=progress,
                           seed=settings.seed, depth=recall_depth(settings))


def _train_recall_holdout(settings: Settings, artifact_dir: Path, split: Split, progress: bool) -> dict[str, Any]:
    from recall.train import train_two_tower  # lazy: imports torch

    seqs, targets = holdout_sequences(split, settings.coarse.train_positions)
    return train_two_tower(
        split, artifact_dir / "recall_holdout", recall_config(settings),
        sequences=seqs, early_stop_targets=targets, progress=progress, seed=settings.seed,
        depth=recall_depth(settings),
    )


def holdout_recall(settings: Settings, artifact_dir: Path, split: Split, positions: int
                   ) -> tuple[RecallStage, RecallStage]:
    """``recall_holdout`` as the coarse ranker's training reads it: (for the valid groups, the valid
    phase's popularity counts; for the train groups, every training event but the train labels,
    ``coarse_rank.dataset.prefix_popularity``, which is what ``recall_holdout`` learnt from).
    Test-time counts would hold each label's own event (and every valid one), which no served
    request's popularity holds. The stage serves the recall stage's config (``recall_config``: a
    ``recall_llm`` stage's own params left out; the LLM channel has no held-out copy)."""
    from coarse_rank.dataset import prefix_popularity  # lazy: imports pandas

    spec = settings.pipeline.stage("recall")
    recall = RecallStage(spec.model_copy(update={"kind": "recall", "params": {}}), recall_config(settings))
    recall.load(artifact_dir, subdir="recall_holdout", phase="valid")
    return recall, recall.with_popularity(prefix_popularity(split, positions))


def _train_coarse(settings: Settings, artifact_dir: Path, split: Split, progress: bool) -> dict[str, Any]:
    from coarse_rank.train import train_coarse  # lazy: imports scipy

    recall, before_labels = holdout_recall(settings, artifact_dir, split, settings.coarse.train_positions)
    return train_coarse(split, recall, artifact_dir / "coarse", settings.coarse, seed=settings.seed, progress=progress,
                        train_stage=before_labels)


def _train_fusion(settings: Settings, artifact_dir: Path, split: Split, progress: bool) -> dict[str, Any]:
    return tune_fusion(settings, artifact_dir, split, progress=progress)


def _train_llm(settings: Settings, artifact_dir: Path, split: Split, progress: bool) -> dict[str, Any]:
    # valid phase: the LLM learns from valid items, which the served (refit) recall model has learnt
    cascade = PipelineStage(build_pipeline(settings, artifact_dir, only=("recall", "coarse"), phase="valid"))
    return train_llm(split, cascade, settings, artifact_dir, progress=progress)


_TRAINERS = {"recall": _train_recall, "recall_holdout": _train_recall_holdout, "coarse": _train_coarse,
             "fusion": _train_fusion, "llm": _train_llm}
