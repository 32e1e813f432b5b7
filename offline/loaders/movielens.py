"""MovieLens-100K (``u.*``) and MovieLens-1M (``*.dat``) directories -> canonical ``Dataset``.

ML-100K (GroupLens README): ``u.data`` tab-separated ``user item rating timestamp``;
``u.item`` '|'-separated ``id|title|release date|video release date|IMDb URL|`` + one 0/1 flag
per genre of ``u.genre`` (``name|index``), latin-1; ``u.user`` ``id|age|gender|occupation|zip``.
ML-1M: '::'-separated ``ratings.dat`` (latin-1 as GroupLens ships it, UTF-8 where the bytes are: MovieTweetings) (UserID::MovieID::Rating::Timestamp),
``movies.dat`` (MovieID::Title::Genres, genres '|'-joined), optional ``users.dat``
(UserID::Gender::Age::Occupation::Zip, age and occupation as codes). A ``users.dat`` of another
layout (MovieTweetings': ``UserID::TwitterID``) gives the user ids only, from its first field, with
a warning that the user attributes were not read.

Item ``year`` is the year in the title (the film's year; ML-100K's release date is the US
video release and only used when the title has none). ``text`` is built by ``describe``
because MovieLens has no plot text. ``audience``/``risk_level`` are unknown (None / <NA>).

Deliberately left out: the CSV releases (``movielens_csv``), filtering and splitting.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd

from offline.loaders import checks, common
from offline.loaders.reading import UTF8_ELSE_LATIN1, first_row_width, read_delimited
from offline.schema import Dataset

log = logging.getLogger(__name__)

LATIN1 = "latin-1"
ML100K_ITEM_FIELDS = ("item_id", "title", "release_date", "video_release_date", "imdb_url")
NO_GENRE = {"unknown", "(no genres listed)"}  # placeholders for "no genre", not categories
ML1M_USER_FIELDS = ("user_id", "gender", "age", "occupation", "zip")

# ML-1M README: age is the lower bound of a bracket ("1" = under 18); occupation is a code.
ML1M_AGE_GROUPS = {1: "Under 18", 18: "18-24", 25: "25-34", 35: "35-44", 45: "45-49", 50: "50-55", 56: "56+"}
ML1M_OCCUPATIONS = (
    "other", "academic/educator", "artist", "clerical/admin", "college/grad student", "customer service",
    "doctor/health care", "executive/managerial", "farmer", "homemaker", "K-12 student", "lawyer",
    "programmer", "retired", "sales/marketing", "scientist", "self-employed", "technician/engineer",
    "tradesman/craftsman", "unemployed", "writer",
)


def load_ml100k(directory: Path) -> Dataset:
    directory = Path(directory)
    genres = _ml100k_genres(directory / "u.genre")
    items = _ml100k_items(directory / "u.item", genres)
    users = _ml100k_users(directory / "u.user")
    # latin-1 like u.item and u.user (GroupLens' encoding), so an id reads alike in every file
    table = read_delimited(directory / "u.data", "\t", ("user_id", "item_id", "rating", "timestamp"), encoding=LATIN1)
    events = common.interactions(
        table, items=items["item_id"], items_file="u.item", users=users["user_id"], users_file="u.user",
    )
    return Dataset(directory.name, events, items, users)


def _ml100k_genres(path: Path) -> list[str]:
    table = read_delimited(path, "|", ("name", "index"), encoding=LATIN1)
    checks.require_file_rows(table)
    index = checks.numbers(table, "index", "genre index", integer=True).to_numpy(dtype=np.int64)
    table.fail_first(index != np.arange(len(table)), lambda pos: f"genre index {index[pos]}, expected {pos}")
    return checks.ids(table, "name", "genre name").tolist()


def _ml100k_items(path: Path, genres: list[str]) -> pd.DataFrame:
    flag_cols = [f"genre_{i}" for i in range(len(genres))]
    table = read_delimited(path, "|", ML100K_ITEM_FIELDS + tuple(flag_cols), encoding=LATIN1)
    checks.require_file_rows(table)
    item_id = checks.ids(table, "item_id", "item id")
    checks.unique(table, item_id, "item id")
    flags = table.rows[flag_cols].to_numpy(dtype=str)
    bad_flag = ~np.isin(flags, ["0", "1"])
    table.fail_first(bad_flag.any(axis=1), lambda pos: _bad_flag_message(flags[pos], genres))
    names = np.asarray(genres, dtype=object)
    real_genre = np.array([g not in NO_GENRE for g in genres])
    categories = [list(names[row & real_genre]) for row in flags == "1"]

    release = checks.text(table, "release_date")
    release_year = release.str.extract(r"^\d{1,2}-[A-Za-z]{3}-(\d{4})$")[0]
    table.fail_first(
        (release != "").to_numpy() & release_year.isna().to_numpy(),
        lambda pos: f"release date {release.iat[pos]!r} is not DD-Mon-YYYY",
    )
    titles = table.rows["title"].str.strip()
    years = [common.year_from_title(t) or (int(r) if isinstance(r, str) else None)
             for t, r in zip(titles, release_year, strict=True)]
    urls = checks.text(table, "imdb_url")
    attributes = [json.dumps({k: v for k, v in (("release_date", d), ("imdb_url", u)) if v})
                  for d, u in zip(release, urls, strict=True)]
    return pd.DataFrame({
        "item_id": item_id, "title": titles,
        "text": [common.describe(t, c) for t, c in zip(titles, categories, strict=True)],
        "categories": categories, "year": pd.array(years, dtype="Int64"), "attributes": attributes,
    })


def _bad_flag_message(row: np.ndarray, genres: list[str]) -> str:
    i = int(np.flatnonzero(~np.isin(row, ["0", "1"]))[0])
    return f"genre flag for {genres[i]!r} is {str(row[i])!r}, expected 0 or 1"


def _ml100k_users(path: Path) -> pd.DataFrame:
    table = read_delimited(path, "|", ("user_id", "age", "gender", "occupation", "zip"), encoding=LATIN1)
    checks.require_file_rows(table)
    user_id = checks.ids(table, "user_id", "user id")
    checks.unique(table, user_id, "user id")
    return pd.DataFrame({
        "user_id": user_id,
        "age": checks.numbers(table, "age", "age", integer=True, low=0, high=130, allow_empty=True),
        "gender": checks.choice(table, "gender", ("M", "F"), "gender"),
        "occupation": _optional(checks.text(table, "occupation")),
        "zip": _optional(checks.text(table, "zip")),
    })


def load_ml1m(directory: Path) -> Dataset:
    directory = Path(directory)
    items = _ml1m_movies(directory / "movies.dat")
    users = _ml1m_users(directory / "users.dat") if (directory / "users.dat").exists() else None
    table = read_delimited(directory / "ratings.dat", "::", ("user_id", "item_id", "rating", "timestamp"),
                           UTF8_ELSE_LATIN1)
    events = common.interactions(
        table, items=items["item_id"], items_file="movies.dat",
        users=None if users is None else users["user_id"], users_file="users.dat",
    )
    return Dataset(directory.name, events, items, common.users_seen(events) if users is None else users)


def movie_items(item_id: pd.Series, titles: pd.Series, genres: pd.Series,
                tags: dict[str, list[str]] | None = None) -> pd.DataFrame:
    """Items from MovieLens ``id, title, 'A|B' genres`` columns (ML-1M and the CSV releases)."""
    categories = [[g for g in s.split("|") if g and g not in NO_GENRE] for s in genres]
    tags = tags or {}
    return pd.DataFrame({
        "item_id": item_id, "title": titles,
        "text": [common.describe(t, c, tags.get(i, [])) for i, t, c in zip(item_id, titles, categories, strict=True)],
        "categories": categories,
        "year": pd.array([common.year_from_title(t) for t in titles], dtype="Int64"),
    })


def _ml1m_movies(path: Path) -> pd.DataFrame:
    table = read_delimited(path, "::", ("item_id", "title", "genres"), encoding=UTF8_ELSE_LATIN1)
    checks.require_file_rows(table)
    item_id = checks.ids(table, "item_id", "movie id")
    checks.unique(table, item_id, "movie id")
    return movie_items(item_id, checks.nonempty(table, "title", "title"), checks.text(table, "genres"))


def _ml1m_users(path: Path) -> pd.DataFrame:
    width = first_row_width(path, "::", UTF8_ELSE_LATIN1)
    if width not in (0, len(ML1M_USER_FIELDS)):
        return _user_ids_only(path, width)
    table = read_delimited(path, "::", ML1M_USER_FIELDS, encoding=UTF8_ELSE_LATIN1)
    checks.require_file_rows(table)
    user_id = checks.ids(table, "user_id", "user id")
    checks.unique(table, user_id, "user id")
    age = checks.numbers(table, "age", "age code", integer=True)
    table.fail_first(~age.isin(list(ML1M_AGE_GROUPS)).to_numpy(),
                     lambda pos: f"age code {age.iat[pos]} is not one of {sorted(ML1M_AGE_GROUPS)}")
    occ = checks.numbers(table, "occupation", "occupation code", integer=True, low=0, high=len(ML1M_OCCUPATIONS) - 1)
    return pd.DataFrame({
        "user_id": user_id, "age": age,  # the bracket's lower bound; "1" keeps under-18s below 18
        "gender": checks.choice(table, "gender", ("M", "F"), "gender"),
        "occupation": [ML1M_OCCUPATIONS[int(o)] for o in occ],
        "zip": _optional(checks.text(table, "zip")),
        "attributes": [json.dumps({"age_group": ML1M_AGE_GROUPS[int(a)]}) for a in age],
    })


def _user_ids_only(path: Path, width: int) -> pd.DataFrame:
    """The user ids of a ``users.dat`` whose lines hold ``width`` fields, not ML-1M's five: the first field
    of each line (every line must have ``width``), the others not read, and a warning that says so."""
    table = read_delimited(path, "::", ("user_id", *(f"field_{i}" for i in range(2, width + 1))),
                           encoding=UTF8_ELSE_LATIN1)
    checks.require_file_rows(table)
    user_id = checks.ids(table, "user_id", "user id")
    checks.unique(table, user_id, "user id")
    log.warning("%s: %d '::'-separated field(s) per line, not ML-1M's %d (%s): the first was read as the user "
                "id, the rest not; the users have no attributes (age, gender, occupation)", path.name, width,
                len(ML1M_USER_FIELDS), "::".join(ML1M_USER_FIELDS))
    return pd.DataFrame({"user_id": user_id})


def _optional(values: pd.Series) -> pd.Series:
    return values.astype(object).where(values != "", None)

