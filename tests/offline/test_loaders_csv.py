"""MovieLens CSV releases, the generic CSV/Parquet layout, format detection and dispatch."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from offline.loaders import detect_format, load_dataset
from offline.schema import DataError

MOVIES = (
    "movieId,title,genres\n"
    "1,Toy Story (1995),Adventure|Animation|Children\n"
    '11,"American President, The (1995)",Comedy|Drama|Romance\n'
    "3,Some Doc (2001),(no genres listed)\n"
)
RATINGS = "userId,movieId,rating,timestamp\n1,1,4.0,964982703\n1,11,3.5,964981247\n2,3,0.5,964982224\n"
TAGS = "userId,movieId,tag,timestamp\n1,1,pixar,1\n2,1,fun,2\n3,1,Pixar,3\n4,1,  ,4\n"


def write_ml_csv(root: Path, **override: str | bytes) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    files: dict[str, str | bytes] = {"movies.csv": MOVIES, "ratings.csv": RATINGS, "tags.csv": TAGS}
    files.update(override)
    for name, content in files.items():
        (root / name).write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return root


def test_ml_csv_takes_any_rating_scale(tmp_path: Path) -> None:
    ds = load_dataset(write_ml_csv(tmp_path / "my-movies", **{"ratings.csv": RATINGS.replace("0.5", "10")}))
    assert ds.interactions["rating"].tolist() == [4.0, 3.5, 10.0]


def test_ml_csv_tiny_loads_exact_rows(tmp_path: Path) -> None:
    ds = load_dataset(write_ml_csv(tmp_path / "ml-latest-small"))
    assert ds.name == "ml-latest-small"
    assert ds.interactions["user_id"].tolist() == ["1", "1", "2"]
    assert ds.interactions["item_id"].tolist() == ["1", "11", "3"]
    assert ds.interactions["rating"].tolist() == [4.0, 3.5, 0.5]
    assert ds.items["title"].tolist() == ["Toy Story (1995)", "American President, The (1995)", "Some Doc (2001)"]
    assert ds.items["categories"].tolist() == [["Adventure", "Animation", "Children"], ["Comedy", "Drama", "Romance"], []]
    # "pixar" twice (case-insensitive, first spelling kept) outranks "fun"; blank tags are dropped
    assert ds.items["text"].iloc[0] == "Toy Story (1995). Genres: Adventure, Animation, Children. Tags: pixar, fun."
    assert ds.items["text"].iloc[2] == "Some Doc (2001)."
    assert ds.items["year"].tolist() == [1995, 1995, 2001]
    assert ds.users["user_id"].tolist() == ["1", "2"]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"ratings.csv": RATINGS + "3,1,4.0\n"}, "ratings.csv line 5: expected 4 comma-separated fields, got 3"),
        ({"ratings.csv": RATINGS.replace("1,11,3.5,964981247", "1,11,3.5,964981247,9")},
         "ratings.csv line 3: expected 4 comma-separated fields, got 5"),
        ({"ratings.csv": RATINGS.replace("0.5", "nan")}, "ratings.csv line 4: rating 'nan' is not a number"),
        ({"ratings.csv": RATINGS.replace("3.5", "good")}, "ratings.csv line 3: rating 'good' is not a number"),
        ({"ratings.csv": "userId,movieId,rating\n1,1,4\n"}, "ratings.csv line 1: header lacks column(s) ['timestamp']"),
        ({"ratings.csv": RATINGS.encode() + b"2,1,4.0,\xff\n"}, "ratings.csv line 5: not valid utf-8"),
        ({"ratings.csv": RATINGS + "2,12,4.0,1\n"}, "ratings.csv line 5: unknown item id '12' (not in movies.csv)"),
        ({"tags.csv": TAGS + "1,9,scary,5\n"}, "tags.csv line 6: unknown movie id '9' (not in movies.csv)"),
        ({"movies.csv": MOVIES + "1,Dup (1990),Drama\n"}, "movies.csv line 5: duplicate movie id '1'"),
    ],
)
def test_ml_csv_malformed_names_file_and_line(tmp_path: Path, override: dict[str, str | bytes], message: str) -> None:
    with pytest.raises(DataError) as err:
        load_dataset(write_ml_csv(tmp_path / "ml", **override))
    assert message in str(err.value)


def test_ml_csv_utf8_title_loads(tmp_path: Path) -> None:
    ds = load_dataset(write_ml_csv(tmp_path / "ml", **{"movies.csv": MOVIES.replace("Some Doc", "Amélie")}))
    assert ds.items["title"].iloc[2] == "Amélie (2001)"


GENERIC_ITEMS = (
    "item_id,title,text,categories,audience,risk_level,year,price\n"
    "a,Alpha,,news|tech,all,0,2020,9.99\n"
    "b,Beta,A thriller.,thriller,adult,2,,\n"
)


def write_generic(root: Path, **files: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    defaults = {"items.csv": GENERIC_ITEMS,
                "interactions.csv": "user_id,item_id,timestamp\nx,a,2021-01-01T00:00:00Z\nx,b,100\n"}
    for name, text in (defaults | files).items():
        (root / name).write_text(text)
    return root


def test_generic_csv_implicit_ratings_and_attributes(tmp_path: Path) -> None:
    root = write_generic(tmp_path / "shop", **{
        "interactions.csv": "user_id,item_id,timestamp\nx,a,2021-01-01T00:00:00Z\nx,b,2021-01-01T00:01:00Z\n"})
    ds = load_dataset(root)
    assert detect_format(root) == "generic" and ds.name == "shop"
    assert ds.interactions["rating"].tolist() == [1.0, 1.0]  # implicit feedback
    assert ds.interactions["timestamp"].tolist() == [1609459200, 1609459260]
    assert ds.items["categories"].tolist() == [["news", "tech"], ["thriller"]]
    assert ds.items["text"].tolist() == ["Alpha. Genres: news, tech.", "A thriller."]  # empty text is built
    assert ds.items["audience"].tolist() == ["all", "adult"]
    assert ds.items["risk_level"].tolist() == [0, 2]
    assert ds.items["year"].iloc[0] == 2020 and pd.isna(ds.items["year"].iloc[1])
    assert json.loads(ds.items["attributes"].iloc[0]) == {"price": "9.99"}
    assert json.loads(ds.items["attributes"].iloc[1]) == {}
    assert ds.users["user_id"].tolist() == ["x"]


def test_generic_parquet_with_users_and_list_categories(tmp_path: Path) -> None:
    root = tmp_path / "pq"
    root.mkdir()
    pd.DataFrame({"user_id": [1, 2], "item_id": ["a", "b"], "rating": [4.0, 2.0], "timestamp": [10, 20]}).to_parquet(
        root / "interactions.parquet")
    pd.DataFrame({"item_id": ["a", "b"], "categories": [["x", "y"], []]}).to_parquet(root / "items.parquet")
    pd.DataFrame({"user_id": ["1", "2"], "age": [16, None], "risk_tolerance": [1, 3]}).to_parquet(
        root / "users.parquet")
    ds = load_dataset(root)
    assert ds.interactions["user_id"].tolist() == ["1", "2"]
    assert ds.interactions["rating"].tolist() == [4.0, 2.0]
    assert ds.items["categories"].tolist() == [["x", "y"], []]
    assert ds.items["title"].tolist() == ["a", "b"]
    assert ds.users["age"].iloc[0] == 16 and pd.isna(ds.users["age"].iloc[1])
    assert ds.users["risk_tolerance"].tolist() == [1, 3]


def test_generic_parquet_errors_name_the_row(tmp_path: Path) -> None:
    root = tmp_path / "pq"
    root.mkdir()
    pd.DataFrame({"user_id": ["1", "2"], "item_id": ["a", "zz"], "timestamp": [10, 20]}).to_parquet(
        root / "interactions.parquet")
    pd.DataFrame({"item_id": ["a"]}).to_parquet(root / "items.parquet")
    with pytest.raises(DataError, match=r"interactions.parquet row 2: unknown item id 'zz' \(not in items.parquet\)"):
        load_dataset(root)


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"interactions.csv": "user_id,item_id\nx,a\n"}, "interactions.csv: no 'timestamp' column"),
        ({"items.csv": GENERIC_ITEMS.replace(",adult,", ",R,")},
         "items.csv line 3: audience 'R' is not one of ['adult', 'all', 'teen']"),
        ({"items.csv": GENERIC_ITEMS.replace(",0,2020", ",5,2020")}, "items.csv line 2: risk level 5 is outside [0, 3]"),
        ({"users.csv": "user_id,age\ny,30\n"}, "interactions.csv line 2: unknown user id 'x' (not in users.csv)"),
        ({"interactions.csv": "user_id,item_id,timestamp\nx,a,yesterday\n"},
         "interactions.csv line 2: timestamp 'yesterday' is neither a number"),
    ],
)
def test_generic_malformed(tmp_path: Path, files: dict[str, str], message: str) -> None:
    with pytest.raises(DataError) as err:
        load_dataset(write_generic(tmp_path / "g", **files))
    assert message in str(err.value)


def test_generic_without_items_names_both_candidates(tmp_path: Path) -> None:
    root = write_generic(tmp_path / "g")
    (root / "items.csv").unlink()
    with pytest.raises(DataError, match="neither items.csv nor items.parquet found"):
        load_dataset(root)


@pytest.mark.parametrize(
    ("files", "fmt"),
    [(["u.data", "u.item"], "ml-100k"), (["ratings.dat", "movies.dat"], "ml-1m"),
     (["ratings.csv", "movies.csv"], "ml-csv"), (["interactions.parquet"], "generic"), (["interactions.csv"], "generic")],
)
def test_detect_format(tmp_path: Path, files: list[str], fmt: str) -> None:
    for name in files:
        (tmp_path / name).write_text("")
    assert detect_format(tmp_path) == fmt


def test_detect_format_unknown_lists_what_it_looked_for(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("")
    with pytest.raises(DataError) as err:
        detect_format(tmp_path)
    for marker in ("u.data", "ratings.dat", "ratings.csv", "interactions.csv", "notes.txt"):
        assert marker in str(err.value)
    with pytest.raises(DataError, match="no such directory"):
        detect_format(tmp_path / "absent")


def test_load_dataset_dispatch_and_argument_checks(tmp_path: Path) -> None:
    ds = load_dataset(None, n_users=20, n_items=40, seed=3)
    assert ds.name == "synthetic" and len(ds.users) == 20 and len(ds.items) == 40
    root = write_ml_csv(tmp_path / "ml")
    with pytest.raises(ValueError, match="only apply to the synthetic dataset"):
        load_dataset(root, n_users=5)
    with pytest.raises(ValueError, match="unknown dataset format 'ml-2m'"):
        load_dataset(root, fmt="ml-2m")
    with pytest.raises(DataError, match=r"ml/u\.genre: file not found"):
        load_dataset(root, fmt="ml-100k")  # an explicit format is trusted, then its files are required
