"""MovieLens CSV releases (ml-latest, ml-latest-small, ml-20m, ml-25m) -> canonical ``Dataset``.

Files (GroupLens README, UTF-8, header row): ``ratings.csv`` ``userId,movieId,rating,timestamp``
(half stars 0.5..5.0); ``movies.csv`` ``movieId,title,genres`` with genres '|'-joined and
``(no genres listed)`` for none; optional ``tags.csv`` ``userId,movieId,tag,timestamp``: the
most frequent tags of a movie (up to ``MAX_TAGS``) are appended to its text, since free-text
tags are the closest thing to a description these releases have.

There is no users file: the users table holds ids only. ``links.csv`` and the tag genome are
ignored. Deliberately left out: ``*.dat`` releases (``movielens``), filtering and splitting.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from offline.loaders import checks, common
from offline.loaders.movielens import movie_items
from offline.loaders.reading import read_csv
from offline.schema import Dataset

MAX_TAGS = 10


def load_ml_csv(directory: Path) -> Dataset:
    directory = Path(directory)
    movies = read_csv(directory / "movies.csv", ("movieId", "title", "genres"))
    checks.require_file_rows(movies)
    item_id = checks.ids(movies, "movieId", "movie id")
    checks.unique(movies, item_id, "movie id")
    tags_path = directory / "tags.csv"
    tags = _top_tags(tags_path, item_id) if tags_path.exists() else {}
    items = movie_items(item_id, checks.nonempty(movies, "title", "title"), checks.text(movies, "genres"), tags)

    ratings = read_csv(directory / "ratings.csv", ("userId", "movieId", "rating", "timestamp"),
                       rename={"userId": "user_id", "movieId": "item_id"})
    events = common.interactions(ratings, items=items["item_id"], items_file="movies.csv")
    return Dataset(directory.name, events, items, common.users_seen(events))


def _top_tags(path: Path, movie_ids: pd.Series) -> dict[str, list[str]]:
    """movie id -> its most used tags (case-insensitive, most frequent first, ties by first use)."""
    table = read_csv(path, ("userId", "movieId", "tag", "timestamp"))
    movie = checks.ids(table, "movieId", "movie id")
    checks.known(table, movie, pd.Index(movie_ids), "movie id", "movies.csv")
    tag = checks.text(table, "tag")
    used = pd.DataFrame({"movie": movie, "key": tag.str.lower(), "tag": tag, "order": np.arange(len(tag))})
    used = used[used["key"] != ""]
    counted = used.groupby(["movie", "key"], sort=False).agg(
        n=("order", "size"), first=("order", "min"), tag=("tag", "first")
    ).reset_index()
    counted = counted.sort_values(["movie", "n", "first"], ascending=[True, False, True])
    top = counted.groupby("movie", sort=False).head(MAX_TAGS)
    return {m: list(g["tag"]) for m, g in top.groupby("movie", sort=False)}
