"""The robustness battery: the defaults run over dataset shapes unlike each other, in one table.

Defaults tuned on one dataset do not transfer by themselves, so they are judged on a table of
shapes built from the data at hand: the dataset as published (ML-100K, Amazon Scientific), and
ML-100K rewritten into shapes that stress one thing each:

- ``ml100k-600-long``: the 600 users with the longest histories (few users, long sequences);
- ``ml100k-wide``: the catalog widened with synthetic long-tail items (each bought by a few
  random users, before their last two real events), so the catalog is several times larger than
  the signal while every held-out target stays a real item;
- ``ml100k-generic``: ML-100K in the generic layout with its optional items file (titles and
  categories, no users file): the layout a user brings, with content;
- ``ml100k-generic-full``: the generic layout with every optional file and column (items with
  text, year, audience and risk level; users with age, gender, occupation, zip and risk tolerance),
  so the compliance rules have something to enforce on real histories;
- ``movielens-csv``: ML-100K rewritten as a MovieLens CSV release (``ratings.csv``,
  ``movies.csv``) in a folder whose name says nothing of the dataset;
- ``shop-min``: the generic layout with no items or users file (no content, no attributes);
- ``synthetic``: the generated default shop.

Each shape is evaluated by ``recsys eval`` in a child process, exactly as a user runs it (the
defaults, ``--seeds N``; the time-based cold-item protocol, where the shape has real times, for
the first seed), and the table gives per shape: the best simple baseline, two-tower recall, coarse and
served NDCG@10 (mean ± sd), candidate recall@200, the verdict against the best baseline, the
two-tower's epochs and whether every fit converged (early-stopped, not stopped by the budget),
and, with new items, the new-item slice's recall and coarse NDCG@10.

Deliberately left out: datasets the machine does not have (a shape whose source is missing is
listed as skipped, with the path it looked for).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from jobs.evaluation.seeds import mean_sd
from offline.loaders import load_dataset
from recsys.atomic import atomic_write_text

WIDE_FACTOR = 3  # synthetic long-tail items per real item in ml100k-wide
WIDE_BUYERS = (5, 10)  # random users per synthetic item (enough to pass the 5-core filter)
LONG_USERS = 600
BUILT = ".built"  # written in a shape's data folder once its builder returned


def _write_generic(directory: Path, interactions: pd.DataFrame, items: pd.DataFrame | None) -> Path:
    """The generic CSV layout (``interactions.csv`` and, when given, ``items.csv``), categories ``|``-joined."""
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write_text(directory / "interactions.csv",
                      interactions[["user_id", "item_id", "rating", "timestamp"]].to_csv(index=False))
    if items is not None:
        table = items[["item_id", "title", "categories"]].copy()
        table["categories"] = ["|".join(c) for c in table["categories"]]
        atomic_write_text(directory / "items.csv", table.to_csv(index=False))
    return directory


def long_histories(source: Path, out: Path, users: int = LONG_USERS) -> Path:
    """The ``users`` users with the most interactions, with their whole histories and the items file."""
    data = load_dataset(source)
    counts = data.interactions["user_id"].value_counts(sort=False)
    keep = counts.sort_values(ascending=False, kind="stable").index[:users]
    return _write_generic(out, data.interactions[data.interactions["user_id"].isin(keep)], data.items)


def widened(source: Path, out: Path, factor: int = WIDE_FACTOR, seed: int = 0) -> Path:
    """The dataset plus ``factor`` synthetic items per real item, each with a few random buyers.

    A synthetic item ``syn-<n>`` is interacted with by 5-10 random users, each at a random time
    between the user's first event and the one before their second-to-last (so the valid and
    test targets of the leave-one-out protocol stay real items: at random times over the whole
    span, about 95% of ML-100K's targets became synthetic items, noise no model can predict); it
    has a title and no category, so only ids and popularity tell it apart.
    """
    data = load_dataset(source)
    rng = np.random.default_rng(seed)
    inter = data.interactions
    times = inter.sort_values(["user_id", "timestamp"], kind="stable").groupby("user_id", sort=True)["timestamp"]
    users = np.asarray(times.first().index)
    first = times.first().to_numpy(np.int64)
    # before the second-to-last event; a user with under 3 events gets their first event's time
    last_free = np.maximum(first, times.nth(-2).reindex(times.first().index).fillna(first[0]).to_numpy(np.int64) - 1)
    n_new = factor * len(data.items)
    buyers = rng.integers(WIDE_BUYERS[0], WIDE_BUYERS[1] + 1, n_new)
    who = np.concatenate([rng.choice(len(users), b, replace=False) for b in buyers])
    rows = pd.DataFrame({
        "user_id": users[who],
        "item_id": np.repeat([f"syn-{i}" for i in range(n_new)], buyers),
        "rating": 1.0,
        "timestamp": first[who] + (rng.random(len(who)) * (last_free[who] - first[who] + 1)).astype(np.int64),
    })
    items = pd.concat([data.items, pd.DataFrame({"item_id": [f"syn-{i}" for i in range(n_new)],
                                                 "title": [f"Catalog item {i}" for i in range(n_new)],
                                                 "categories": [[] for _ in range(n_new)]})], ignore_index=True)
    return _write_generic(out, pd.concat([inter, rows], ignore_index=True), items)


def generic_with_items(source: Path, out: Path) -> Path:
    """The dataset in the generic layout with its optional items file (titles, categories)."""
    data = load_dataset(source)
    return _write_generic(out, data.interactions, data.items)


def generic_full(source: Path, out: Path) -> Path:
    """The dataset in the generic layout with every optional file and column.

    Items keep their title, text, categories and year, get an audience (``adult`` for horror,
    ``teen`` for crime, thrillers and war, ``all`` otherwise) and a risk level (1 for horror, 0
    otherwise), and their other fields ride along as an extra column; users keep age, gender,
    occupation and zip and get a risk tolerance (0 under 18, 3 otherwise).
    """
    data = load_dataset(source)
    _write_generic(out, data.interactions, None)
    items = data.items.copy()
    cats = items["categories"].map(set)
    items["audience"] = ["adult" if "Horror" in c else "teen" if c & {"Crime", "Thriller", "War"} else "all"
                         for c in cats]
    items["risk_level"] = [1 if "Horror" in c else 0 for c in cats]
    items["year"] = items["year"].astype("Int64")  # written as 1995, not 1995.0; unknown stays empty
    items["categories"] = ["|".join(c) for c in items["categories"]]
    # a column outside the schema, which the loader keeps in the attributes JSON
    items["release_date"] = [json.loads(a).get("release_date", "") for a in items["attributes"]]
    atomic_write_text(out / "items.csv", items[["item_id", "title", "text", "categories", "audience", "risk_level",
                                                "year", "release_date"]].to_csv(index=False))
    users = data.users.copy()
    users["risk_tolerance"] = np.where(users["age"].to_numpy() < 18, 0, 3)
    atomic_write_text(out / "users.csv", users[["user_id", "age", "gender", "occupation", "zip",
                                                "risk_tolerance"]].to_csv(index=False))
    return out


def movielens_csv(source: Path, out: Path) -> Path:
    """The dataset as a MovieLens CSV release: ``ratings.csv`` and ``movies.csv`` (genres ``|``-joined)."""
    data = load_dataset(source)
    out.mkdir(parents=True, exist_ok=True)
    ratings = data.interactions.rename(columns={"user_id": "userId", "item_id": "movieId"})
    movies = pd.DataFrame({"movieId": data.items["item_id"], "title": data.items["title"],
                           "genres": ["|".join(c) or "(no genres listed)" for c in data.items["categories"]]})
    atomic_write_text(out / "movies.csv", movies.to_csv(index=False))
    atomic_write_text(out / "ratings.csv", ratings[["userId", "movieId", "rating", "timestamp"]].to_csv(index=False))
    return out


def log_only(source: Path, out: Path) -> Path:
    """The interaction log alone, in the generic layout (no items or users file)."""
    return _write_generic(out, load_dataset(source).interactions, None)


# name -> (source dataset under the datasets folder or None for the synthetic default, builder or None)
SHAPES: dict[str, tuple[str | None, Callable[[Path, Path], Path] | None]] = {
    "ml100k": ("ml-100k", None),
    "amazon-scientific": ("amazon-scientific", None),
    "ml100k-600-long": ("ml-100k", long_histories),
    "ml100k-wide": ("ml-100k", widened),
    "ml100k-generic": ("ml-100k", generic_with_items),
    "ml100k-generic-full": ("ml-100k", generic_full),
    "movielens-csv": ("ml-100k", movielens_csv),
    "shop-min": ("ml-100k", log_only),
    "synthetic": (None, None),
}


def shape_data(name: str, datasets: Path, work: Path) -> Path | None:
    """The data directory of a shape (built under ``work`` once); None for the synthetic default."""
    source, build = SHAPES[name]
    if source is None:
        return None
    src = datasets / source
    if not src.is_dir():
        raise FileNotFoundError(f"{name}: needs {src}")
    if build is None:
        return src
    out = work / "data" / name
    if not (out / BUILT).exists():  # a build cut short is built again, never used half-written
        build(src, out)
        (out / BUILT).touch()
    return out


def eval_command(name: str, data: Path | None, work: Path, seeds: int, config: Path | None) -> list[str]:
    """The ``recsys eval`` command line of one shape (the cold-item protocol runs once, for the first seed)."""
    cmd = [sys.executable, "-m", "cli.main", "eval", "--artifacts", str(work / "artifacts" / name),
           "--seeds", str(seeds), "--out", str(work / f"{name}.json")]
    cmd += ["--data", str(data)] if data is not None else []
    cmd += ["--config", str(config)] if config is not None else []
    return cmd


def run_battery(shapes: Sequence[str], datasets: Path, work: Path, *, seeds: int = 3, config: Path | None = None,
                echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Evaluate every shape (reusing a shape's report when its file exists) and return the table's rows."""
    rows: dict[str, Any] = {}
    for name in shapes:
        try:
            data = shape_data(name, datasets, work)
        except FileNotFoundError as exc:
            rows[name] = {"skipped": str(exc)}
            echo(f"{name}: skipped ({exc})")
            continue
        report_path = work / f"{name}.json"
        if not report_path.exists():
            t0 = time.perf_counter()
            echo(f"{name}: recsys eval --seeds {seeds} ...")
            done = subprocess.run(eval_command(name, data, work, seeds, config), capture_output=True, text=True)
            if done.returncode not in (0,) or not report_path.exists():
                rows[name] = {"failed": (done.stderr.strip().splitlines() or ["no output"])[-1],
                              "exit": done.returncode}
                echo(f"{name}: failed ({rows[name]['failed']})")
                continue
            echo(f"{name}: done in {time.perf_counter() - t0:.0f} s")
        rows[name] = shape_row(json.loads(report_path.read_text()))
        rows[name]["data"] = str(data) if data is not None else "synthetic default"
    return rows


def _per_seed(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The per-seed eval reports of a ``--seeds N`` report, or the one report of a single run."""
    return list(report["per_seed"].values()) if "per_seed" in report else [report]


def shape_row(report: dict[str, Any]) -> dict[str, Any]:
    """One table row from a shape's eval report (a single run or ``--seeds N``)."""
    runs = _per_seed(report)
    stages = {name: mean_sd([r["stages"][name]["ndcg@10"] for r in runs])
              for name in runs[0]["stages"] if all(name in r["stages"] for r in runs)}
    base = [r.get("baselines", {}) for r in runs]
    fits = [f for r in runs for f in (r.get("recall_train") or {}).values()]
    row: dict[str, Any] = {
        "seeds": len(runs), "users": report.get("n_users", runs[0].get("n_users")),
        "items": report.get("n_items", runs[0].get("n_items")),
        "stages": stages,
        "candidate_recall@200": mean_sd([r["candidate_recall"].get("recall@200", float("nan")) for r in runs]),
        "best_baseline": [b.get("best") for b in base],
        "verdict": [b.get("verdict") for b in base],
        "epochs": [f.get("epochs") for f in fits], "best_epochs": [f.get("best_epoch") for f in fits],
        "converged": all(not f.get("out_of_budget") and not f.get("out_of_time") for f in fits) if fits else None,
        "warnings": sorted({w for r in runs for w in r.get("warnings", [])}),
    }
    cold = report.get("cold_items") or runs[0].get("cold_items") or {}
    if "slices" in cold:
        sl = cold["slices"]["cold_item"]
        row["new_items"] = {"users": sl["users"], **{s: sl["stages"][s]["ndcg@10"] for s in ("recall", "coarse")
                                                       if s in sl["stages"]}}
    elif "skipped" in cold:
        row["new_items"] = {"skipped": cold["skipped"]}
    return row


def battery_table(rows: dict[str, Any]) -> str:
    """The battery as a Markdown table (NDCG@10 mean ± sd)."""
    def cell(x: dict[str, float] | None) -> str:
        return "–" if not x else f"{x['mean']:.4f} ± {x['sd']:.4f}"

    out = ["| shape | users × items | seeds | best baseline | recall | coarse | served | vs baseline | "
           "cand. recall@200 | epochs (best) | converged | new items: recall / coarse |", "|" + "---|" * 12]
    for name, row in rows.items():
        if "stages" not in row:
            out.append(f"| {name} | {row.get('skipped') or row.get('failed')} |" + " |" * 10)
            continue
        st = row["stages"]
        best = max(set(row["best_baseline"]), key=row["best_baseline"].count)
        new = row.get("new_items") or {}
        new_cell = ("skipped (no clock)" if "skipped" in new else
                    f"{new.get('recall', 0):.4f} / {new.get('coarse', 0):.4f} ({new['users']} users)" if new else "–")
        epochs = ", ".join(f"{e} ({b})" for e, b in zip(row["epochs"], row["best_epochs"], strict=True))
        out.append(f"| {name} | {row['users']} × {row['items']} | {row['seeds']} | {best} {cell(st.get(best))} | "
                   f"{cell(st.get('recall'))} | {cell(st.get('coarse'))} | {cell(st.get('final'))} | "
                   f"{'/'.join(sorted(set(row['verdict'])))} | {cell(row['candidate_recall@200'])} | {epochs} | "
                   f"{'yes' if row['converged'] else 'no'} | {new_cell} |")
    return "\n".join(out) + "\n"
