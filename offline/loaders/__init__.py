"""Dataset loaders: a directory in a known layout (or nothing: synthetic) -> canonical ``Dataset``.

``detect_format`` recognises a layout by its files; ``load_dataset`` dispatches to the loader:

========== ================================================ =========================
format     marker file(s)                                   module
========== ================================================ =========================
ml-100k    ``u.data`` (+ ``u.item``, ``u.user``, ``u.genre``) ``movielens``
ml-1m      ``ratings.dat`` (+ ``movies.dat``, ``users.dat``)  ``movielens``
ml-csv     ``ratings.csv`` (+ ``movies.csv``, ``tags.csv``)   ``movielens_csv``
generic    ``interactions.csv|.parquet`` (+ items, users)   ``generic``
synthetic  (no path)                                        ``offline.synthetic``
========== ================================================ =========================

Every loader validates completely: a missing or malformed file raises ``DataError`` naming
the file and line; nothing is skipped silently. Loader modules import lazily so that importing
this package costs nothing.

``item_noun`` gives the word the LLM prompts use for an item when ``llm.domain`` is not set: the
MovieLens layouts and the synthetic set (films with genres) hold movies, a generic log holds items.

Deliberately left out: k-core filtering and splitting (``offline.protocol``), caching of
loaded datasets (``Dataset.save``/``load``).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from pathlib import Path
from typing import Any

from offline.schema import DataError, Dataset
from offline.synthetic import generate

# format -> (marker files, any of which identifies it; "module:function" of its loader)
FORMATS: dict[str, tuple[tuple[str, ...], str]] = {
    "ml-100k": (("u.data",), "offline.loaders.movielens:load_ml100k"),
    "ml-1m": (("ratings.dat",), "offline.loaders.movielens:load_ml1m"),
    "ml-csv": (("ratings.csv",), "offline.loaders.movielens_csv:load_ml_csv"),
    "generic": (("interactions.csv", "interactions.parquet"), "offline.loaders.generic:load_generic"),
}
SYNTHETIC = "synthetic"
GENERIC_NOUN = "item"
# format -> what one of its items is called in a prompt; a layout not named here says GENERIC_NOUN
ITEM_NOUNS = {"ml-100k": "movie", "ml-1m": "movie", "ml-csv": "movie", SYNTHETIC: "movie"}


def item_noun(fmt: str | None) -> str:
    """The prompt's word for an item of a dataset in layout ``fmt`` (None: unknown).

    >>> item_noun("ml-csv"), item_noun("generic"), item_noun(None)
    ('movie', 'item', 'item')
    """
    return ITEM_NOUNS.get(fmt or "", GENERIC_NOUN)


def format_of_files(names: Any) -> str | None:
    """The layout whose marker file is among ``names`` (checked in ``FORMATS`` order), else None.

    >>> format_of_files(["movies.csv", "ratings.csv"]), format_of_files(["items.csv"])
    ('ml-csv', None)
    """
    present = set(names)
    return next((fmt for fmt, (markers, _) in FORMATS.items() if present.intersection(markers)), None)


def detect_format(path: Path) -> str:
    """The layout of directory ``path``: "ml-100k" | "ml-1m" | "ml-csv" | "generic".

    Checked in table order, so a directory holding both ``u.data`` and ``ratings.csv`` is
    ML-100K. Raises DataError listing the marker files looked for when none is present.
    """
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such directory")
    if not path.is_dir():
        raise DataError(f"{path}: expected a dataset directory, got a file")
    if fmt := format_of_files(p.name for p in path.iterdir() if p.is_file()):
        return fmt
    looked_for = "; ".join(f"{' or '.join(markers)} ({fmt})" for fmt, (markers, _) in FORMATS.items())
    present = sorted(p.name for p in path.iterdir())[:10]
    raise DataError(f"{path}: unknown dataset layout; looked for {looked_for}; found {present or 'nothing'}")


# Raised whenever a loader reads the same files differently (a parsing fix): a split prepared by an
# older revision is then prepared again (``jobs.prepare.prepare``), never reused with the old reading.
# 2: items.csv categories quoted twice or given as a JSON list, '::' files read as UTF-8 where valid.
LOADER_REVISION = 2


def load_dataset(path: Path | None, fmt: str | None = None, **synthetic_kwargs: Any) -> Dataset:
    """Load ``path`` in format ``fmt`` (detected when None); ``path=None`` generates the synthetic set.

    ``synthetic_kwargs`` (``n_users``, ``n_items``, ``seed``, ...) go to
    ``offline.synthetic.generate`` and are refused for a real dataset. An unknown ``fmt`` is
    refused with or without a path, and a real format without a path too (no path never turns a
    format into the synthetic set).
    """
    if fmt is not None and fmt != SYNTHETIC and fmt not in FORMATS:
        raise ValueError(f"unknown dataset format {fmt!r}; known: {sorted(FORMATS) + [SYNTHETIC]}")
    if path is None and fmt not in (None, SYNTHETIC):
        raise ValueError(f"format {fmt!r} needs a dataset directory (--data); without one the synthetic set is used")
    if path is None or fmt == SYNTHETIC:
        if path is not None:
            raise ValueError(f"format 'synthetic' takes no path, got {path}")
        return generate(**synthetic_kwargs)
    if synthetic_kwargs:
        raise ValueError(f"{sorted(synthetic_kwargs)} only apply to the synthetic dataset, not to {path}")
    if fmt is None:
        fmt = detect_format(Path(path))
    if not Path(path).is_dir():
        raise DataError(f"{path}: no such directory")
    return _loader(fmt)(Path(path).resolve())  # resolved: `--data .` names the dataset by its directory


def _loader(fmt: str) -> Callable[[Path], Dataset]:
    module, func = FORMATS[fmt][1].split(":")
    loader: Callable[[Path], Dataset] = getattr(import_module(module), func)
    return loader


__all__ = ["FORMATS", "GENERIC_NOUN", "LOADER_REVISION", "SYNTHETIC", "DataError", "detect_format", "format_of_files",
           "item_noun", "load_dataset"]
