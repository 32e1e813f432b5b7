"""MovieLens CSV releases, the generic CSV/Parquet layout, format detection and dispatch."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from offline.loaders import detect_format, load_dataset
from offline.loaders.reading import read_csv
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
        # the loader renames userId/movieId to user_id/item_id: a file holding both names is refused
        ({"ratings.csv": "userId,movieId,rating,timestamp,user_id\n1,1,4.0,964982703,u1\n"},
         "ratings.csv line 1: column 'user_id' clashes with 'userId' (renamed to user_id)"),
        ({"ratings.csv": '\nitem_id,userId,movieId,rating,timestamp\n"a",1,1,4.0,964982703\n'},
         "ratings.csv line 2: column 'item_id' clashes with 'movieId' (renamed to item_id)"),
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
                "interactions.csv": "user_id,item_id,timestamp\nx,a,2021-01-01T00:00:00Z\nx,b,2021-01-01T00:01:00Z\n"}
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


@pytest.mark.parametrize(("value", "message"), [
    ({"name": "x"}, r"categories must be a '\|'-joined string or a list of names, got dict"),
    ([{"name": "y"}], r"categories must be names \(strings\), got dict"),
    ([["y"]], r"categories must be names \(strings\), got ndarray"),
    (7.5, r"categories must be a '\|'-joined string or a list of names, got float 7.5"),
])
def test_generic_parquet_categories_that_are_not_names_are_refused(tmp_path: Path, value: object,
                                                                   message: str) -> None:
    # a struct column was read as no categories at all, a list of structs as a category named "{'name': 'y'}"
    root = tmp_path / "pq"
    root.mkdir()
    pd.DataFrame({"user_id": ["1"], "item_id": ["a"], "timestamp": [10]}).to_parquet(root / "interactions.parquet")
    pd.DataFrame({"item_id": ["a", "b"], "categories": [value, value]}).to_parquet(root / "items.parquet")
    with pytest.raises(DataError, match="items.parquet row 1: " + message):
        load_dataset(root)


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
        ({"interactions.csv": "user_id,item_id,timestamp\nx,a,2021-01-01T00:00:00Z\nx,b,100\n"},
         "interactions.csv line 3: timestamp '100' is a number (unix seconds) but interactions.csv line 2 holds "
         "'2021-01-01T00:00:00Z'; use one form"),
        ({"interactions.csv": "user_id,item_id,timestamp\nx,a,2021-03-01T10:00:00+05:30\nx,b,2021-03-01T10:00:01\n"},
         "interactions.csv line 3: timestamp '2021-03-01T10:00:01' has no time zone but interactions.csv line 2 "
         "holds '2021-03-01T10:00:00+05:30'"),
        ({"interactions.csv": "user_id,item_id,timestamp\nx,a,2021-03-01T10:00:00\nx,b,20210301T120500+0530\n"},
         "interactions.csv line 2: timestamp '2021-03-01T10:00:00' has no time zone but interactions.csv line 3"),
        ({"interactions.csv": "user_id,item_id,timestamp\nx,a,2021-03-01T10:00:00Z\nx,b,yesterday\n"},
         "interactions.csv line 3: timestamp 'yesterday' is neither a number (unix seconds) nor an ISO-8601"),
        ({"interactions.csv": "user_id,item_id,timestamp\nx,a,2021-03-01T10:00:00+05:00\nx,b,2021-03-01T10:00:01\n"},
         "interactions.csv line 3: timestamp '2021-03-01T10:00:01' has no time zone but interactions.csv line 2 "
         "holds '2021-03-01T10:00:00+05:00'"),
    ],
)
def test_generic_malformed(tmp_path: Path, files: dict[str, str], message: str) -> None:
    with pytest.raises(DataError) as err:
        load_dataset(write_generic(tmp_path / "g", **files))
    assert message in str(err.value)


def test_generic_without_items_takes_the_items_the_log_names(tmp_path: Path) -> None:
    root = write_generic(tmp_path / "g")
    (root / "items.csv").unlink()
    ds = load_dataset(root)
    assert ds.items["item_id"].tolist() == list(dict.fromkeys(ds.interactions["item_id"]))
    assert ds.items["title"].tolist() == ds.items["item_id"].tolist()
    assert all(cats == [] for cats in ds.items["categories"])


def test_generic_says_which_interaction_columns_it_does_not_read(tmp_path: Path, caplog) -> None:
    root = write_generic(tmp_path / "g")
    text = (root / "interactions.csv").read_text().splitlines()
    (root / "interactions.csv").write_text("\n".join([text[0] + ",device"] + [r + ",web" for r in text[1:]]) + "\n")
    with caplog.at_level("WARNING"):
        load_dataset(root)
    assert "interactions.csv: column(s) ['device'] not read" in caplog.text


def test_generic_without_interactions_names_both_candidates(tmp_path: Path) -> None:
    root = write_generic(tmp_path / "g")
    (root / "interactions.csv").rename(root / "events.csv")
    with pytest.raises(DataError, match="unknown dataset layout|neither interactions.csv nor interactions.parquet"):
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
    with pytest.raises(ValueError, match="unknown dataset format 'nope'"):
        load_dataset(None, fmt="nope")  # no path: refused all the same, not the synthetic set
    with pytest.raises(ValueError, match="format 'ml-100k' needs a dataset directory"):
        load_dataset(None, fmt="ml-100k")  # a real format without its data is not the synthetic set either
    with pytest.raises(DataError, match=r"ml/u\.genre: file not found"):
        load_dataset(root, fmt="ml-100k")  # an explicit format is trusted, then its files are required


# --- hostile input: every bad file is one DataError naming file and line, never a traceback


BIG = "x" * 200_000  # over the csv module's default 128 KiB field limit


@pytest.mark.parametrize(
    ("files", "check"),
    [
        ({"items.csv": f"item_id,title,price\na,{BIG},\nb,Beta,\n"}, lambda ds: ds.items["title"].iloc[0] == BIG),
        ({"items.csv": f'item_id,title,price\na,"{BIG}, quoted",\nb,Beta,\n'},
         lambda ds: ds.items["title"].iloc[0] == BIG + ", quoted"),
    ],
)
def test_generic_field_over_128k_loads(tmp_path: Path, files: dict[str, str], check) -> None:  # type: ignore[no-untyped-def]
    assert check(load_dataset(write_generic(tmp_path / "g", **files)))


def test_ml_csv_field_over_128k_loads(tmp_path: Path) -> None:
    movies = MOVIES.replace("Some Doc (2001),(no genres listed)", f'"{BIG} (2001)",')
    ratings = "userId,movieId,rating,timestamp,note\n1,1,4.0,964982703,\n2,3,0.5,964982224," + BIG + "\n"
    ds = load_dataset(write_ml_csv(tmp_path / "ml", **{"movies.csv": movies, "ratings.csv": ratings}))
    assert ds.items["title"].iloc[2] == f"{BIG} (2001)" and ds.items["categories"].iloc[2] == []
    assert ds.interactions["item_id"].tolist() == ["1", "3"]


@pytest.mark.parametrize("newline", ["\r", "\r\n", "\n"])
def test_csv_line_ends_cr_crlf_lf_load_alike_and_count_lines(tmp_path: Path, newline: str) -> None:
    items = "item_id,title,price\na,Alpha,\nb,Beta,\n"
    events = "user_id,item_id,timestamp\nx,a,1\n\nx,b,2\n"
    root = write_generic(tmp_path / "g")
    (root / "items.csv").write_bytes(items.replace("\n", newline).encode())
    (root / "interactions.csv").write_bytes(events.replace("\n", newline).encode())
    ds = load_dataset(root)
    assert ds.items["title"].tolist() == ["Alpha", "Beta"]
    assert ds.interactions["item_id"].tolist() == ["a", "b"]
    (root / "interactions.csv").write_bytes((events + "y,zz,3\n").replace("\n", newline).encode())
    with pytest.raises(DataError, match=r"interactions.csv line 5: unknown item id 'zz'"):
        load_dataset(root)


def test_bad_byte_line_counts_cr_line_ends(tmp_path: Path) -> None:
    ratings = RATINGS.replace("\n", "\r").encode() + b"2,1,4.0,\xff\r"
    with pytest.raises(DataError, match="ratings.csv line 5: not valid utf-8"):
        load_dataset(write_ml_csv(tmp_path / "ml", **{"ratings.csv": ratings}))


def test_csv_quoted_line_breaks_load_and_later_lines_keep_their_numbers(tmp_path: Path) -> None:
    items = 'item_id,title,text\na,"Multi\nline\r\ntitle",\nb,Beta,"two\nlines"\nc,Gamma,\n'
    root = write_generic(tmp_path / "g")
    (root / "items.csv").write_bytes(items.encode())
    ds = load_dataset(root)
    assert ds.items["title"].tolist() == ["Multi\nline\r\ntitle", "Beta", "Gamma"]
    assert ds.items["text"].tolist()[1] == "two\nlines"
    (root / "items.csv").write_bytes((items + "a,Again,\n").encode())
    with pytest.raises(DataError, match=r"items.csv line 8: duplicate item id 'a' \(first defined at items.csv line 2\)"):
        load_dataset(root)
    (root / "items.csv").write_bytes((items + "d\n").encode())  # a record is reported by its first line
    with pytest.raises(DataError, match="items.csv line 8: expected 3 comma-separated fields, got 1"):
        load_dataset(root)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('item_id,title\na,"open\nb,Beta\n', 'items.csv line 2: not valid CSV (a quoted field is never closed)'),
        ('item_id,title\na,"Alpha"x\n', "items.csv line 2: not valid CSV"),
        ("item_id,title\na,Alpha,extra\nb,Beta\n", "items.csv line 2: expected 2 comma-separated fields, got 3"),
    ],
)
def test_csv_bad_quoting_and_long_first_row_are_refused(tmp_path: Path, content: str, message: str) -> None:
    # a first data row one field longer than the header used to become pandas' index silently
    with pytest.raises(DataError) as err:
        load_dataset(write_generic(tmp_path / "g", **{"items.csv": content}))
    assert message in str(err.value)


def test_csv_quoted_and_unquoted_files_give_the_same_table(tmp_path: Path) -> None:
    # the unquoted file takes pandas' fast path, the quoted one the csv module: same rows, same lines
    plain = "\r\n\r\nuser_id,item_id,,timestamp\r\nx,a,,1\r\n,,,\r\n,\r\n\r\ny, b ,q,2\r\nz,a,,3\r\n"
    quoted = plain.replace("y, b ,q,2", '"y"," b ","q",2')
    tables = []
    for name, content in (("plain", plain), ("quoted", quoted)):
        path = tmp_path / name / "interactions.csv"
        path.parent.mkdir()
        path.write_bytes(content.encode())
        tables.append(read_csv(path, ("user_id", "item_id")).rows)
    pd.testing.assert_frame_equal(tables[0], tables[1])
    assert tables[0].to_dict("list") == {"user_id": ["x", "y", "z"], "item_id": ["a", " b ", "a"],
                                         "Unnamed: 2": ["", "q", ""], "timestamp": ["1", "2", "3"],
                                         "_line": [4, 8, 9]}


def test_timestamps_keep_range_edges_and_floor_iso_fractions(tmp_path: Path) -> None:
    events = ("user_id,item_id,timestamp\nx,a,-9223372036\nx,b,9223372036\n"
              "y,a,1677-09-21T00:12:44Z\ny,b,2021-01-01T00:00:00.7Z\ny,a,1969-12-31T23:59:59.5Z\n")
    root = write_generic(tmp_path / "g", **{"interactions.csv": events.split("y,a,1677")[0]})
    assert load_dataset(root).interactions["timestamp"].tolist() == [-9223372036, 9223372036]
    root = write_generic(tmp_path / "h", **{"interactions.csv": "user_id,item_id,timestamp\n" + events.split("\n", 3)[3]})
    assert load_dataset(root).interactions["timestamp"].tolist() == [-9223372036, 1609459200, -1]


def test_generic_parquet_duplicate_columns_bytes_and_far_dates_are_refused(tmp_path: Path) -> None:
    root = tmp_path / "pq"
    root.mkdir()
    pd.DataFrame({"user_id": ["1"], "item_id": ["a"], "timestamp": [10]}).to_parquet(root / "interactions.parquet")
    pd.DataFrame({"item_id": ["a"], "title": [b"\xff\xfe"]}).to_parquet(root / "items.parquet")
    with pytest.raises(DataError, match="items.parquet row 1: title is bytes, not UTF-8 text"):
        load_dataset(root)
    pd.DataFrame({"item_id": ["a"]}).to_parquet(root / "items.parquet")
    far = pd.Series(pd.to_datetime(["2020-01-01", "9999-01-01"]).as_unit("s"))
    pd.DataFrame({"user_id": ["1", "1"], "item_id": ["a", "a"], "timestamp": far}).to_parquet(root / "interactions.parquet")
    with pytest.raises(DataError, match="interactions.parquet row 2: timestamp '9999-01-01 00:00:00' is outside"):
        load_dataset(root)
    pq.write_table(pa.Table.from_arrays([pa.array(["1"]), pa.array(["a"]), pa.array([1]), pa.array([2])],
                                        names=["user_id", "item_id", "timestamp", "timestamp"]),
                   root / "interactions.parquet")
    with pytest.raises(DataError, match=r"interactions.parquet: duplicate column name\(s\) \['timestamp'\]"):
        load_dataset(root)


def test_generic_reads_every_zoned_iso_form_alike(tmp_path: Path) -> None:
    stamps = ["2021-03-01T10:00:00Z", "2021-03-01T10:00:01z", "20210301T153002+0530", "2021-03-01T10+00",
              "2021-03-01 05:00:04 -05:00"]
    rows = "\n".join(f"x,a{i},{t}" for i, t in enumerate(stamps))
    ds = load_dataset(write_generic(tmp_path / "g", **{
        "interactions.csv": "user_id,item_id,timestamp\n" + rows + "\n",
        "items.csv": "item_id\n" + "\n".join(f"a{i}" for i in range(len(stamps))) + "\n"}))
    assert (ds.interactions["timestamp"] - 1614592800).tolist() == [0, 1, 2, 0, 4]
