"""Whether B's artifact directory holds A's split, and when not, what differs and how to train B on it.

``recsys ab offline --artifacts-b`` measures both variants on A's split, so B's stages must have
been trained on the same one (``offline.split.split_id``). A refusal that says only "another
split" sends the user back to the command they ran: a fresh directory is prepared with the
defaults (5-core, the interacted catalog), so B's split differs from an A prepared with
``--catalog listed`` or ``--k-core 3`` although both came from the same data. ``split_differences``
names each difference from the two ``source.json``/``split.json`` records (dataset, files,
``k_core``, ``catalog``, ``format``, synthetic size, else the protocol), and ``check_same_split``
suggests the ``recsys train`` command with A's options.

Deliberately left out: the stage-level checks (``cascade.registry.check_trained_on_split``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jobs.prepare import DEFAULT_CATALOG, DEFAULT_K_CORE, recorded_source
from offline.split import split_id

# option -> (its CLI flag, its value when the record lacks it)
_OPTIONS = {"k_core": ("--k-core", DEFAULT_K_CORE), "catalog": ("--catalog", DEFAULT_CATALOG), "format": ("--format", None)}
_SYNTHETIC_FLAGS = {"n_users": "--synthetic-users", "n_items": "--synthetic-items"}
_MOST_PROTOCOL_KEYS = 5  # a split of other data differs in every count: the first few say enough


def _split_json(artifact_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads((Path(artifact_dir) / "split" / "split.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _protocol(split: dict[str, Any]) -> dict[str, Any]:
    protocol = split.get("protocol")
    return protocol if isinstance(protocol, dict) else {}


def _option(source: dict[str, Any], split: dict[str, Any], key: str) -> Any:
    """The split's ``key`` option: its source record's, else its protocol's, else the default."""
    return source.get(key, _protocol(split).get(key, _OPTIONS[key][1]))


def _file_differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """``"items.csv 4,130 vs 4,170 bytes"``, ``"users.csv only in A's"`` ... for the files that differ."""
    out = []
    for name in sorted(set(a) | set(b)):
        if a.get(name) == b.get(name):
            continue
        if name not in b or name not in a:
            out.append(f"{name} only in {'A' if name in a else 'B'}'s")
        elif a[name][0] != b[name][0]:
            out.append(f"{name} {a[name][0]:,} vs {b[name][0]:,} bytes")
        else:
            out.append(f"{name} same size, other content")
    return out


def split_differences(art_a: Path, art_b: Path) -> list[str]:
    """What differs between the splits under ``art_a`` and ``art_b``, each as ``"<what> <A's> vs <B's>"``.

    >>> split_differences(Path("/nonexistent-a"), Path("/nonexistent-b"))
    []
    """
    src_a, src_b = recorded_source(art_a), recorded_source(art_b)
    split_a, split_b = _split_json(art_a), _split_json(art_b)
    out = []
    if src_a.get("data") != src_b.get("data"):
        out.append(f"dataset {src_a.get('data')!r} vs {src_b.get('data')!r}")
    elif files := _file_differences(src_a.get("files", {}), src_b.get("files", {})):
        out.append(f"the files of dataset {src_a.get('data')!r} differ ({', '.join(files)})")
    for key in _OPTIONS:
        if (va := _option(src_a, split_a, key)) != (vb := _option(src_b, split_b, key)):
            out.append(f"{key} {va} vs {vb}")
    synth_a, synth_b = src_a.get("synthetic", {}), src_b.get("synthetic", {})
    out += [f"synthetic {key} {synth_a.get(key)} vs {synth_b.get(key)}" for key in sorted(set(synth_a) | set(synth_b))
            if synth_a.get(key) != synth_b.get(key)]
    if out:
        return out
    proto_a, proto_b = _protocol(split_a), _protocol(split_b)  # the same inputs, another protocol
    if split_a.get("name") != split_b.get("name"):
        out.append(f"name {split_a.get('name')!r} vs {split_b.get('name')!r}")
    keys = [k for k in sorted(set(proto_a) | set(proto_b)) if proto_a.get(k) != proto_b.get(k)]
    return out + [f"protocol {k} {proto_a.get(k)} vs {proto_b.get(k)}" for k in keys[:_MOST_PROTOCOL_KEYS]]


def train_options(art_a: Path) -> str:
    """The options that prepare A's split again, e.g. ``" --k-core 3 --catalog listed"`` ("" for the defaults);
    ``--k-core`` always, since a directory that holds a split keeps its k-core otherwise."""
    src, split = recorded_source(art_a), _split_json(art_a)
    opts = []
    for key, (flag, default) in _OPTIONS.items():
        value = _option(src, split, key)
        if value is not None and (value != default or key == "k_core"):
            opts.append(f"{flag} {value}")
    if src.get("data") == "synthetic":
        opts += [f"{_SYNTHETIC_FLAGS[k]} {v}" for k, v in src.get("synthetic", {}).items() if k in _SYNTHETIC_FLAGS]
    return "".join(f" {o}" for o in opts)


def check_same_split(art_a: Path, art_b: Path) -> None:
    """``ValueError`` naming what differs when ``art_b`` holds no split or another split than ``art_a``."""
    has_split = (Path(art_b) / "split" / "split.json").is_file()
    if has_split and split_id(art_b) == split_id(art_a):
        return
    data = recorded_source(art_a).get("data")
    what = (f"no split ({Path(art_b) / 'split' / 'split.json'} is missing)" if not has_split else
            f"another split than {art_a} ({'; '.join(split_differences(art_a, art_b)) or 'their split records differ'})")
    synthetic = data == "synthetic"  # `recsys train` without --data
    data_dir = "" if synthetic else " --data DIR"
    where = "" if synthetic else ", DIR being the data A's split was prepared from" + (f" ({data!r})" if data else "")
    raise ValueError(f"{art_b}: B's artifact directory holds {what}; both variants must be trained on the split they "
                     f"are measured on: `recsys train{data_dir} --config <B> --artifacts {art_b}{train_options(art_a)}`"
                     f"{where}")
