"""A seeded synthetic catalog, users and time-ordered sessions in the canonical schema.

``generate(...)`` builds a dataset small enough to train the whole pipeline in minutes on
two CPU cores (default ~600 users x ~40 events), yet with the structure each stage needs:

- items: word-list titles ("The Silent Harbor"), 1-2 sentence descriptions naming the genre
  and a mood, 1-3 genres, an audience rating correlated with genre (horror/thriller/crime lean
  "adult", animation/family "all"), a risk level 0..3, a year, and a latent factor vector
  (genre centroid + noise) with a Zipf popularity.
- users: age 13-70 (about 15% under 18), gender, occupation, zip, risk tolerance 0..3, and a
  latent taste: a sparse Dirichlet mixture over genres (tilted by age) + a latent vector.
- sessions: each user has several sessions (drawn from a per-user pool of items above
  ``POOL_ITEMS`` items, see there); a session has a focus genre drawn from the
  taste, and each next item is drawn (Gumbel-max, without repeats) from taste + popularity +
  a strong pull toward the previous item's latent neighbourhood and its "follow-up" item (a
  sequel-like successor). That first-order structure is what lets a sequence model beat
  popularity. Under-18 users rarely pick adult items (a large logit penalty), so the audience
  rule has something realistic to enforce. Ratings 1-5 follow the taste match; timestamps
  increase within and across sessions.

Deliberately left out: splitting (``offline.protocol``); any claim of matching real data
statistics beyond these qualitative shapes. The latent factors are not exported.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from offline.schema import AUDIENCES, Dataset

# genre -> (P(all), P(teen), P(adult)), risk tendency 0..2, subjects, moods
GENRE_PROFILES: dict[str, tuple[tuple[float, float, float], float, tuple[str, ...], tuple[str, ...]]] = {
    "Action": ((0.2, 0.5, 0.3), 1.2, ("a retired agent", "a getaway driver", "a rookie pilot"), ("explosive", "relentless")),
    "Comedy": ((0.45, 0.4, 0.15), 0.4, ("two mismatched roommates", "a hapless wedding planner"), ("witty", "light-hearted")),
    "Drama": ((0.3, 0.45, 0.25), 0.6, ("a struggling teacher", "an estranged family"), ("moving", "quiet")),
    "Horror": ((0.0, 0.25, 0.75), 2.0, ("a group of campers", "a night-shift nurse"), ("terrifying", "eerie")),
    "Romance": ((0.35, 0.45, 0.2), 0.4, ("a florist and a violinist", "two rival chefs"), ("tender", "bittersweet")),
    "Sci-Fi": ((0.3, 0.5, 0.2), 0.8, ("the crew of a deep-space freighter", "an android"), ("mind-bending", "visionary")),
    "Thriller": ((0.05, 0.35, 0.6), 1.6, ("a disgraced detective", "a whistle-blower"), ("tense", "gripping")),
    "Animation": ((0.85, 0.15, 0.0), 0.0, ("a curious fox", "a toy robot"), ("charming", "colourful")),
    "Documentary": ((0.7, 0.25, 0.05), 0.3, ("deep-sea explorers", "a jazz legend"), ("illuminating", "candid")),
    "Fantasy": ((0.45, 0.45, 0.1), 0.7, ("a young sorceress", "an exiled prince"), ("enchanting", "epic")),
    "Crime": ((0.05, 0.35, 0.6), 1.7, ("a crew of bank robbers", "a small-town sheriff"), ("gritty", "dark")),
    "Family": ((0.9, 0.1, 0.0), 0.0, ("three siblings", "a lost puppy"), ("heart-warming", "playful")),
    "Adventure": ((0.5, 0.4, 0.1), 0.8, ("a treasure hunter", "two young explorers"), ("sweeping", "daring")),
    "Mystery": ((0.2, 0.5, 0.3), 1.0, ("an amateur sleuth", "a village librarian"), ("puzzling", "atmospheric")),
    "War": ((0.05, 0.4, 0.55), 1.8, ("a platoon of conscripts", "a field medic"), ("harrowing", "unflinching")),
    "Western": ((0.3, 0.45, 0.25), 1.2, ("a bounty hunter", "a frontier widow"), ("dusty", "stoic")),
    "Musical": ((0.75, 0.2, 0.05), 0.1, ("a chorus girl", "a street band"), ("joyful", "toe-tapping")),
    "History": ((0.4, 0.45, 0.15), 0.7, ("a medieval scribe", "a suffragette"), ("sweeping", "meticulous")),
}
GENRES = tuple(GENRE_PROFILES)
YOUNG_GENRES = ("Animation", "Family", "Action", "Comedy", "Fantasy", "Adventure", "Sci-Fi")
MATURE_GENRES = ("Drama", "Documentary", "History", "War", "Western", "Mystery")

ADJECTIVES = ("Silent", "Hollow", "Crimson", "Last", "Broken", "Golden", "Distant", "Frozen", "Hidden", "Burning",
              "Midnight", "Lonely", "Electric", "Wild", "Forgotten", "Secret", "Iron", "Velvet", "Restless", "Paper")
NOUNS = ("Harbor", "Garden", "Signal", "Kingdom", "Promise", "Station", "River", "Letter", "Mirror", "Orchard",
         "Frontier", "Echo", "Lantern", "Storm", "Carnival", "Voyage", "Winter", "Archive", "Compass", "Tide")
PLACES = ("Avalon", "the North", "Old Town", "the Valley", "Marrow Bay", "the Deep", "Cedar Falls", "the Moon")
PLOTS = ("must cross a frozen border", "uncovers a long-buried secret", "gets one last chance",
         "is drawn into a deadly game", "searches for a missing friend", "returns home after twenty years",
         "tries to save a failing business", "stumbles onto a conspiracy", "races against time",
         "learns what family really means")
OCCUPATIONS = ("student", "engineer", "teacher", "nurse", "artist", "writer", "programmer", "sales",
               "retired", "lawyer", "scientist", "technician", "homemaker", "executive", "other")
ROMAN = ("", " II", " III", " IV", " V", " VI", " VII", " VIII", " IX", " X")

LATENT_DIM = 16
ITEM_NOISE = 0.8  # norm of an item's own direction next to its genre centroid (norm <= 1)
USER_NOISE = 0.6
TASTE_WEIGHT = 0.8  # logit weight of log(genre taste match); the +0.02 floor keeps other genres possible
LATENT_WEIGHT = 1.5  # logit weight of cosine(user, item)
POP_EXPONENT = 1.5  # Zipf exponent of item popularity (on rank + 10)
NEIGHBOUR_PULL = 3.0  # logit weight of cosine(previous item, candidate) within a session
FOLLOW_UP_PULL = 2.0  # extra logit for the previous item's sequel-like follow-up
SESSION_FOCUS = 3.0  # logit bonus for the session's focus genre (sessions are about one mood)
MINOR_ADULT_PENALTY = 5.0  # logit penalty on adult items for under-18s: e^-5, rare but not impossible
RATING_BASE = 2.6  # chosen items sit ~1 sd above a user's mean affinity -> mean rating ~3.6
MIN_EVENTS = 5  # every user survives a 5-core filter and a leave-one-out split
# Above this many items a user's events are drawn from a pool: this many items drawn (Gumbel-top-k)
# from the user's taste + popularity, plus their follow-ups (so a sequel stays reachable). Each
# event then costs O(pool) instead of O(n_items); what stays O(n_items) per user is the vectorised
# affinity and the pool draw (bench.scaling times generation apart from the system). A user never
# needs more than ~100 distinct items. Smaller catalogs (the default) use every item.
POOL_ITEMS = 1500
START_TS = 1_546_300_800  # 2019-01-01 UTC


def generate(
    n_users: int = 600,
    n_items: int = 1200,
    n_categories: int = 12,
    mean_sessions: float = 5.0,
    mean_session_len: float = 8.0,
    seed: int = 42,
) -> Dataset:
    """A deterministic synthetic ``Dataset`` named "synthetic" (same arguments -> equal tables)."""
    _check_sizes(n_users, n_items, n_categories, mean_sessions, mean_session_len)
    rng = np.random.default_rng(seed)
    genres = GENRES[:n_categories]
    catalog = _Catalog.draw(rng, n_items, genres)
    users, tastes, user_vecs = _users(rng, n_users, genres, catalog.genre_vecs)
    events = _sessions(rng, catalog, users["age"].to_numpy(), tastes, user_vecs, mean_sessions, mean_session_len)
    width = len(str(max(n_users, n_items)))
    events["user_id"] = [f"u{u + 1:0{width}d}" for u in events.pop("user")]
    events["item_id"] = [f"i{i + 1:0{width}d}" for i in events.pop("item")]
    users.insert(0, "user_id", [f"u{u + 1:0{width}d}" for u in range(n_users)])
    items = catalog.table(width)
    return Dataset("synthetic", events[["user_id", "item_id", "rating", "timestamp"]], items, users)


def _check_sizes(n_users: int, n_items: int, n_categories: int, mean_sessions: float, mean_session_len: float) -> None:
    if n_users < 1:
        raise ValueError(f"n_users must be >= 1, got {n_users}")
    if n_items < 4 * MIN_EVENTS:
        raise ValueError(f"n_items must be >= {4 * MIN_EVENTS}, got {n_items}")
    if not 2 <= n_categories <= len(GENRES):
        raise ValueError(f"n_categories must be in [2, {len(GENRES)}], got {n_categories}")
    if mean_sessions < 1 or mean_session_len < 1:
        raise ValueError(f"mean_sessions and mean_session_len must be >= 1, got {mean_sessions}, {mean_session_len}")


@dataclass(frozen=True)
class _Catalog:
    """Items as arrays (row = item): genre membership, latent vectors, popularity, labels."""

    genres: tuple[str, ...]
    genre_vecs: np.ndarray  # [n_genres, LATENT_DIM] unit centroids
    cats: list[list[int]]  # genre indices per item, primary first
    membership: np.ndarray  # [n_items, n_genres], rows sum to 1 (primary weighs double)
    vecs: np.ndarray  # [n_items, LATENT_DIM] unit latent factors
    log_pop: np.ndarray  # [n_items] Zipf log-popularity
    follow_up: np.ndarray  # [n_items] a near latent neighbour: the "sequel" a session tends to go on to
    audience: np.ndarray  # [n_items] index into AUDIENCES
    risk: np.ndarray  # [n_items] 0..3
    titles: list[str]
    texts: list[str]
    years: np.ndarray

    @classmethod
    def draw(cls, rng: np.random.Generator, n_items: int, genres: tuple[str, ...]) -> _Catalog:
        n_g = len(genres)
        genre_vecs = _unit(rng.normal(size=(n_g, LATENT_DIM)))
        genre_share = rng.dirichlet(np.full(n_g, 3.0))  # some genres are bigger than others
        primary = rng.choice(n_g, size=n_items, p=genre_share)
        membership = np.zeros((n_items, n_g))
        cats: list[list[int]] = []
        for i, g in enumerate(primary):
            extra = rng.choice(n_g, size=rng.choice(3, p=[0.45, 0.4, 0.15]), replace=False)
            own = [int(g)] + [int(e) for e in extra if e != g]
            cats.append(own)
            membership[i, own] = 0.5
            membership[i, g] = 1.0
        membership /= membership.sum(axis=1, keepdims=True)
        vecs = _unit(membership @ genre_vecs + ITEM_NOISE * _unit(rng.normal(size=(n_items, LATENT_DIM))))
        # Zipf-like popularity (exponent POP_EXPONENT) on a random order of items
        log_pop = -POP_EXPONENT * np.log(rng.permutation(n_items) + 10.0)
        follow_up = _nearest(vecs, 5)[np.arange(n_items), rng.integers(0, 5, size=n_items)]
        audience, risk = _ratings_for(rng, genres, cats)
        titles, texts = _texts(rng, genres, cats)
        years = np.clip(2024 - np.floor(rng.exponential(14.0, size=n_items)), 1950, 2024).astype(int)
        return cls(genres=genres, genre_vecs=genre_vecs, cats=cats, membership=membership, vecs=vecs,
                   log_pop=log_pop, follow_up=follow_up, audience=audience, risk=risk, titles=titles,
                   texts=texts, years=years)

    def table(self, width: int) -> pd.DataFrame:
        return pd.DataFrame({
            "item_id": [f"i{i + 1:0{width}d}" for i in range(len(self.cats))],
            "title": self.titles, "text": self.texts,
            "categories": [[self.genres[g] for g in c] for c in self.cats],
            "audience": [AUDIENCES[a] for a in self.audience],
            "risk_level": pd.array(self.risk, dtype="Int64"), "year": pd.array(self.years, dtype="Int64"),
        })


def _ratings_for(rng: np.random.Generator, genres: tuple[str, ...], cats: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Audience index (into AUDIENCES) and risk level per item, both driven by its genres."""
    audience = np.empty(len(cats), dtype=np.int64)
    risk = np.empty(len(cats), dtype=np.int64)
    for i, own in enumerate(cats):
        weights = np.array([2.0] + [1.0] * (len(own) - 1))
        probs = sum(w * np.array(GENRE_PROFILES[genres[g]][0]) for w, g in zip(weights, own, strict=True))
        audience[i] = rng.choice(3, p=probs / probs.sum())
        tendency = max(GENRE_PROFILES[genres[g]][1] for g in own)
        risk[i] = int(np.clip(np.round(0.8 * audience[i] + 0.5 * tendency + rng.normal(0, 0.6)), 0, 3))
    return audience, risk


def _texts(rng: np.random.Generator, genres: tuple[str, ...], cats: list[list[int]]) -> tuple[list[str], list[str]]:
    titles: list[str] = []
    texts: list[str] = []
    seen: dict[str, int] = {}
    for own in cats:
        adj, noun, place = rng.choice(ADJECTIVES), rng.choice(NOUNS), rng.choice(PLACES)
        title = (f"The {adj} {noun}", f"{noun} of {place}", f"A {adj} {noun}", f"{adj} {noun} in {place}")[
            rng.integers(4)]
        seen[title] = seen.get(title, 0) + 1
        titles.append(title + ROMAN[min(seen[title] - 1, len(ROMAN) - 1)])
        _, _, subjects, moods = GENRE_PROFILES[genres[own[0]]]
        mood = str(rng.choice(moods))
        article = "An" if mood[0] in "aeiou" else "A"
        text = f"{article} {mood} {genres[own[0]].lower()} story about {rng.choice(subjects)} who {rng.choice(PLOTS)}."
        if len(own) > 1:
            blend = " and ".join(genres[g].lower() for g in own[1:])
            text += f" Blends {blend} with a {rng.choice(GENRE_PROFILES[genres[own[1]]][3])} tone."
        else:
            text += f" Set in {place}."
        texts.append(text)
    return titles, texts


def _users(
    rng: np.random.Generator, n_users: int, genres: tuple[str, ...], genre_vecs: np.ndarray
) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    minor = rng.random(n_users) < 0.15
    age = np.where(minor, rng.integers(13, 18, size=n_users),
                   np.clip(np.round(18 + rng.exponential(14.0, size=n_users)), 18, 70)).astype(int)
    # sparse tastes (Dirichlet alpha < 1: two or three favourite genres), tilted by age
    tilt = np.ones((n_users, len(genres)))
    youth = np.clip((40 - age) / 25, 0, 1)[:, None]
    for g, name in enumerate(genres):
        if name in YOUNG_GENRES:
            tilt[:, g] += youth[:, 0]
        if name in MATURE_GENRES:
            tilt[:, g] += 1 - youth[:, 0]
    tastes = rng.dirichlet(np.full(len(genres), 0.35), size=n_users) * tilt
    tastes /= tastes.sum(axis=1, keepdims=True)
    user_vecs = _unit(tastes @ genre_vecs + USER_NOISE * _unit(rng.normal(size=(n_users, LATENT_DIM))))
    occupation = np.where(minor, "student", rng.choice(OCCUPATIONS, size=n_users))
    tolerance = np.where(minor, rng.integers(0, 2, size=n_users), rng.integers(0, 4, size=n_users))
    users = pd.DataFrame({
        "age": pd.array(age, dtype="Int64"),
        "gender": rng.choice(["F", "M"], size=n_users),
        "occupation": occupation,
        "zip": [f"{z:05d}" for z in rng.integers(1000, 99999, size=n_users)],
        "risk_tolerance": pd.array(tolerance, dtype="Int64"),
    })
    return users, tastes, user_vecs


def _sessions(
    rng: np.random.Generator, catalog: _Catalog, age: np.ndarray, tastes: np.ndarray, user_vecs: np.ndarray,
    mean_sessions: float, mean_session_len: float,
) -> pd.DataFrame:
    n_items = len(catalog.cats)
    adult = catalog.audience == AUDIENCES.index("adult")
    slot = np.full(n_items, -1, dtype=np.int64)  # item -> its position in the user's pool, -1 outside
    cols: dict[str, list] = {"user": [], "item": [], "rating": [], "timestamp": []}
    for u in range(len(age)):
        affinity = (TASTE_WEIGHT * np.log(catalog.membership @ tastes[u] + 0.02)
                    + LATENT_WEIGHT * (catalog.vecs @ user_vecs[u]))
        z = (affinity - affinity.mean()) / (affinity.std() + 1e-9)  # how well each item suits u
        base = affinity + catalog.log_pop - (MINOR_ADULT_PENALTY if age[u] < 18 else 0.0) * adult
        if n_items <= POOL_ITEMS:
            pool = np.arange(n_items)
        else:  # the drawn items and their follow-ups, so a sequel stays reachable from every pick
            drawn = _gumbel_top(rng, base, POOL_ITEMS)
            pool = np.union1d(drawn, catalog.follow_up[drawn])
        slot[pool] = np.arange(len(pool))
        base_p, vecs_p, membership_p = base[pool], catalog.vecs[pool], catalog.membership[pool]
        lengths = np.maximum(1, rng.poisson(mean_session_len - 1, size=1 + rng.poisson(mean_sessions - 1)) + 1)
        lengths[-1] += max(0, MIN_EVENTS - lengths.sum())
        lengths = _cap(lengths, len(pool) - 1)
        seen = np.zeros(len(pool), dtype=bool)
        ts = START_TS + int(rng.integers(0, 3 * 365 * 86400))
        for length in lengths:
            session = base_p + SESSION_FOCUS * membership_p[:, rng.choice(len(tastes[u]), p=tastes[u])]
            session[seen] = -np.inf  # no repeats; picks below are masked as they happen
            prev = -1
            for _ in range(length):
                logits = session
                if prev >= 0:  # first-order pull: latent neighbours and the follow-up of the last item
                    logits = logits + NEIGHBOUR_PULL * (vecs_p @ catalog.vecs[prev])
                    if (follow := slot[catalog.follow_up[prev]]) >= 0:
                        logits[follow] += FOLLOW_UP_PULL
                pick = int(np.argmax(logits + rng.gumbel(size=len(pool))))
                seen[pick], session[pick] = True, -np.inf
                item = int(pool[pick])
                rating = min(max(round(RATING_BASE + 0.9 * z[item] + rng.normal(0, 0.8)), 1), 5)  # half to even
                ts += 60 + int(rng.exponential(25 * 60))
                cols["user"].append(u)
                cols["item"].append(item)
                cols["rating"].append(float(rating))
                cols["timestamp"].append(ts)
                prev = item
            ts += 3600 + int(rng.exponential(4 * 86400))
        slot[pool] = -1
    return pd.DataFrame(cols)


def _gumbel_top(rng: np.random.Generator, logits: np.ndarray, k: int) -> np.ndarray:
    """``k`` items drawn without replacement with probabilities softmax(``logits``) (Gumbel-top-k),
    in item order."""
    return np.sort(np.argpartition(-(logits + rng.gumbel(size=len(logits))), k - 1)[:k])


def _nearest(vecs: np.ndarray, k: int, block: int = 256) -> np.ndarray:
    """``[n, k]`` indices of each row's ``k`` most similar other rows (dot product), best first,
    computed in row blocks so memory stays ``block x n`` rather than ``n x n``."""
    n = len(vecs)
    out = np.empty((n, k), dtype=np.int64)
    for lo in range(0, n, block):
        sim = vecs[lo:lo + block] @ vecs.T
        rows = np.arange(len(sim))
        sim[rows, lo + rows] = -np.inf
        top = np.argpartition(-sim, k - 1, axis=1)[:, :k].copy()  # not a view holding the block's rows
        out[lo:lo + block] = np.take_along_axis(top, np.argsort(-np.take_along_axis(sim, top, 1), axis=1), 1)
    return out


def _cap(lengths: np.ndarray, limit: int) -> np.ndarray:
    """Trim session lengths so a user never needs more distinct items than exist."""
    ends = np.minimum(np.cumsum(lengths), limit)
    trimmed = np.diff(ends, prepend=0)
    return trimmed[trimmed > 0]


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)
