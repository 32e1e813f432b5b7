"""Prepare a dataset for training: load it, split it with the protocol, save the split.

``prepare`` writes ``<artifact_dir>/split/`` and beside it ``source.json``, the dataset's
fingerprint (file names, sizes and content digests, the protocol options): an unchanged dataset
reuses its split, and with it every stage trained on it; any changed byte makes a new split, and a
note says what changed. Options left unset keep the values the split was prepared with.

Deliberately left out: training (``jobs.train``), the protocol itself (``offline.protocol``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from offline.loaders import LOADER_REVISION, detect_format, load_dataset
from offline.protocol import CATALOGS, make_split, outside_users
from offline.schema import Dataset
from offline.split import Split, source_record
from recsys.atomic import atomic_write_json
from recsys.digest import file_sha256

log = logging.getLogger(__name__)

DEFAULT_K_CORE = 5
DEFAULT_CATALOG = "interacted"  # offline.protocol.CATALOGS: the k-core's items, as the published protocols rank
SYNTHETIC_DEFAULTS = {"n_users": 600, "n_items": 1200}  # the synthetic default dataset's size (CLI help)


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
    src = source_record(artifact_dir)
    typed = (isinstance(src.get("files", {}), dict)
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
