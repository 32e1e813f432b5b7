"""Pieces every loader shares: the validated interactions table, item text, title years.

``interactions`` turns a raw ``Table`` of (user, item, rating, timestamp) strings into the
canonical interactions DataFrame, refusing unknown ids, non-numeric ratings or ones float32
cannot hold, and bad timestamps with the file and line. ``describe`` builds the short item
text the LLM re-ranker reads when a dataset has no plot summaries (MovieLens has none).

Deliberately left out: file layouts (one module per format).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import pandas as pd

from offline.loaders import checks
from offline.loaders.reading import Table

_TITLE_YEAR = re.compile(r"\((\d{4})\)\s*$")
IMPLICIT_RATING = 1.0  # an interaction log without ratings counts every event as one positive


def year_from_title(title: str) -> int | None:
    """The year in a MovieLens-style title: ``"Toy Story (1995)"`` -> 1995; none -> None."""
    m = _TITLE_YEAR.search(title)
    return int(m.group(1)) if m else None


def describe(title: str, categories: Sequence[str], tags: Sequence[str] = ()) -> str:
    """``"Toy Story (1995). Genres: Animation, Children's, Comedy."`` (+ ``" Tags: a, b."``)."""
    parts = [title.strip().rstrip(".") + "."]
    if categories:
        parts.append(f"Genres: {', '.join(categories)}.")
    if tags:
        parts.append(f"Tags: {', '.join(tags)}.")
    return " ".join(parts)


def interactions(
    table: Table,
    *,
    items: pd.Series | None,
    items_file: str = "",
    users: pd.Series | None = None,
    users_file: str = "",
) -> pd.DataFrame:
    """Validated canonical interactions from ``table`` columns user_id, item_id[, rating], timestamp.

    Every item must be in ``items`` when given (and every user in ``users`` when given); a missing
    ``rating`` column means implicit feedback (``IMPLICIT_RATING``). Ratings may use any finite
    numeric scale (1-5 stars, 0.5-5 half stars, 0-10): the protocol treats every interaction as
    one positive and records the scale it saw (``offline.protocol``).
    """
    checks.require_file_rows(table)
    user = checks.ids(table, "user_id", "user id")
    item = checks.ids(table, "item_id", "item id")
    if items is not None:
        checks.known(table, item, pd.Index(items), "item id", items_file)
    if users is not None:
        checks.known(table, user, pd.Index(users), "user id", users_file)
    if table.has("rating"):
        rating = checks.float32s(table, "rating", "rating")
    else:
        rating = np.full(len(table), IMPLICIT_RATING, dtype=np.float32)
    return pd.DataFrame(
        {"user_id": user.to_numpy(), "item_id": item.to_numpy(), "rating": rating,
         "timestamp": checks.timestamps(table, "timestamp")}
    )


def users_seen(interactions_df: pd.DataFrame) -> pd.DataFrame:
    """A users table with only ids (in first-seen order) for datasets without user files."""
    return pd.DataFrame({"user_id": pd.unique(interactions_df["user_id"])})


def items_seen(interactions_df: pd.DataFrame) -> pd.DataFrame:
    """An items table with only ids (in first-seen order) for an interaction log without an
    items file: each item titled by its id, no categories, the text built from the title.

    >>> items_seen(pd.DataFrame({"item_id": ["b", "a", "b"]}))[["item_id", "title", "text"]].values.tolist()
    [['b', 'b', 'b.'], ['a', 'a', 'a.']]
    """
    ids = pd.unique(interactions_df["item_id"])
    return pd.DataFrame({"item_id": ids, "title": ids, "text": [describe(str(i), []) for i in ids],
                         "categories": [[] for _ in ids], "attributes": ["{}"] * len(ids)})
