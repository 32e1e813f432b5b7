"""MovieLens-100K and -1M loaders on tiny files written here, plus the real ML-100K."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from offline.loaders import detect_format, load_dataset
from offline.schema import DataError

GENRES = "unknown|0\nAction|1\nComedy|2\nDrama|3\n"
ITEMS = (
    "1|Toy Story (1995)|01-Jan-1995||http://x/1|0|0|1|0\n"
    "2|Misérables, Les (1995)|01-Jan-1995||http://x/2|0|1|0|1\n"
    "3|unknown||||1|0|0|0\n"
)
USERS = "1|24|M|technician|85711\n2|15|F|student|T8H1N\n"
DATA = "1\t1\t5\t881250949\n1\t2\t3\t881250950\n2\t1\t4\t881250000\n"


def write_ml100k(root: Path, **override: str) -> Path:
    files = {"u.genre": GENRES, "u.item": ITEMS, "u.user": USERS, "u.data": DATA} | override
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / name).write_bytes(text.encode("latin-1"))  # the real files are latin-1
    return root


def test_ml100k_layout_reads_a_non_ascii_id_alike_in_every_file(tmp_path: Path) -> None:
    # u.data was read as UTF-8 and u.item as latin-1: "café" in both (latin-1) was "not valid utf-8"
    items = ITEMS.replace("3|unknown|", "caf\u00e9|unknown|")
    ds = load_dataset(write_ml100k(tmp_path / "ml", **{"u.item": items, "u.data": DATA + "2\tcaf\u00e9\t4\t881250001\n"}))
    assert ds.interactions["item_id"].tolist()[-1] == "caf\u00e9"


def test_ml100k_tiny_loads_exact_rows(tmp_path: Path) -> None:
    ds = load_dataset(write_ml100k(tmp_path / "ml"))
    assert ds.name == "ml"  # the directory's name, as every layout names its dataset
    expected = pd.DataFrame({"user_id": ["1", "1", "2"], "item_id": ["1", "2", "1"],
                             "rating": [5.0, 3.0, 4.0], "timestamp": [881250949, 881250950, 881250000]})
    assert ds.interactions.astype({"rating": float, "user_id": object, "item_id": object}).to_dict("list") == (
        expected.to_dict("list"))
    items = ds.items
    assert items["item_id"].tolist() == ["1", "2", "3"]
    assert items["title"].tolist() == ["Toy Story (1995)", "Misérables, Les (1995)", "unknown"]
    assert items["categories"].tolist() == [["Comedy"], ["Action", "Drama"], []]  # "unknown" is no genre
    assert items["text"].tolist() == [
        "Toy Story (1995). Genres: Comedy.", "Misérables, Les (1995). Genres: Action, Drama.", "unknown."]
    assert items["year"].tolist()[:2] == [1995, 1995] and pd.isna(items["year"].iloc[2])
    assert items["audience"].isna().all() and items["risk_level"].isna().all()
    assert json.loads(items["attributes"].iloc[0]) == {"release_date": "01-Jan-1995", "imdb_url": "http://x/1"}
    users = ds.users
    assert users["user_id"].tolist() == ["1", "2"]
    assert users["age"].tolist() == [24, 15]
    assert users["gender"].tolist() == ["M", "F"]
    assert users["zip"].tolist() == ["85711", "T8H1N"]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"u.data": "1\t1\t5\t881250949\n1\t2\t3\n"}, "u.data line 2: expected 4 tab-separated fields, got 3"),
        ({"u.data": "1\t1\t5\t1\n\n1\t2\tx\t2\n"}, "u.data line 3: rating 'x' is not a number"),
        ({"u.data": "1\t1\tinf\t881250949\n"}, "u.data line 1: rating 'inf' is not finite"),
        ({"u.data": "1\t1\t5\t1\n1\t99\t5\t2\n"}, "u.data line 2: unknown item id '99' (not in u.item)"),
        ({"u.data": "1\t1\t5\t1\n7\t1\t5\t2\n"}, "u.data line 2: unknown user id '7' (not in u.user)"),
        ({"u.data": "1\t\t5\t1\n"}, "u.data line 1: empty item id"),
        ({"u.data": "1\t1\t5\tsoon\n"}, "u.data line 1: timestamp 'soon' is neither a number"),
        ({"u.item": ITEMS.replace("|http://x/2|", "|")}, "u.item line 2: expected 9 '|'-separated fields, got 8"),
        ({"u.item": ITEMS.replace("x/1|0|0|1|0", "x/1|0|0|y|0")},
         "u.item line 1: genre flag for 'Comedy' is 'y', expected 0 or 1"),
        ({"u.item": ITEMS + "1|Again (1990)|||u|0|0|0|1\n"}, "u.item line 4: duplicate item id '1' (first defined at u.item line 1)"),
        ({"u.item": ITEMS.replace("01-Jan-1995||http://x/1", "Jan 1995||http://x/1")},
         "u.item line 1: release date 'Jan 1995' is not DD-Mon-YYYY"),
        ({"u.user": "1|abc|M|technician|85711\n"}, "u.user line 1: age 'abc' is not a number"),
        ({"u.user": "1|24|Q|technician|85711\n"}, "u.user line 1: gender 'Q' is not one of ['F', 'M']"),
        ({"u.genre": "unknown|0\nAction|2\n"}, "u.genre line 2: genre index 2, expected 1"),
    ],
)
def test_ml100k_malformed_names_file_and_line(tmp_path: Path, override: dict[str, str], message: str) -> None:
    root = write_ml100k(tmp_path / "ml", **override)
    with pytest.raises(DataError) as err:
        load_dataset(root)
    assert message in str(err.value)


@pytest.mark.parametrize("missing", ["u.item", "u.user", "u.genre"])
def test_ml100k_missing_file_is_named(tmp_path: Path, missing: str) -> None:
    root = write_ml100k(tmp_path / "ml")
    (root / missing).unlink()
    with pytest.raises(DataError, match=rf"{missing}: file not found"):
        load_dataset(root)


def write_ml1m(root: Path, with_users: bool = True, ratings: str | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "ratings.dat").write_bytes((ratings or "1::1::5::978300760\n1::2::3::978302109\n2::2::4::978300000\n")
                                       .encode("latin-1"))
    (root / "movies.dat").write_bytes(
        "1::Toy Story (1995)::Animation|Children's|Comedy\n2::Misérables, Les (1995)::Drama|Musical\n"
        .encode("latin-1"))
    if with_users:
        (root / "users.dat").write_bytes(b"1::F::1::10::48067\n2::M::56::16::70072\n")
    return root


def test_ml1m_tiny_loads_exact_rows(tmp_path: Path) -> None:
    ds = load_dataset(write_ml1m(tmp_path / "one"))
    assert ds.name == "one"  # the directory's name, not the layout's
    assert ds.interactions["user_id"].tolist() == ["1", "1", "2"]
    assert ds.interactions["item_id"].tolist() == ["1", "2", "2"]
    assert ds.interactions["rating"].tolist() == [5.0, 3.0, 4.0]
    assert ds.interactions["timestamp"].tolist() == [978300760, 978302109, 978300000]
    assert ds.items["title"].tolist() == ["Toy Story (1995)", "Misérables, Les (1995)"]
    assert ds.items["categories"].tolist() == [["Animation", "Children's", "Comedy"], ["Drama", "Musical"]]
    assert ds.items["text"].iloc[0] == "Toy Story (1995). Genres: Animation, Children's, Comedy."
    assert ds.items["year"].tolist() == [1995, 1995]
    assert ds.users["age"].tolist() == [1, 56]  # bracket lower bounds; 1 = under 18
    assert ds.users["occupation"].tolist() == ["K-12 student", "self-employed"]
    assert json.loads(ds.users["attributes"].iloc[0]) == {"age_group": "Under 18"}


def test_ml1m_without_users_file_lists_user_ids(tmp_path: Path) -> None:
    ds = load_dataset(write_ml1m(tmp_path / "one", with_users=False))
    assert ds.users["user_id"].tolist() == ["1", "2"]
    assert ds.users["age"].isna().all()


def test_ml1m_layout_takes_any_numeric_rating_scale_under_any_directory_name(tmp_path: Path) -> None:
    # a public benchmark in the .dat layout rates 0..10; implicit feedback does not care
    ds = load_dataset(write_ml1m(tmp_path / "my-ratings", ratings="1::1::0::1\n1::2::10::2\n2::2::7::3\n"))
    assert ds.interactions["rating"].tolist() == [0.0, 10.0, 7.0]


@pytest.mark.parametrize(
    ("ratings", "message"),
    [
        ("1::1::5::1\n1::2::3::2\n1::2::x::3\n", "ratings.dat line 3: rating 'x' is not a number"),
        ("1::1::5\n", "ratings.dat line 1: expected 4 '::'-separated fields, got 3"),
        ("1::1::5::1\n3::1::5::2\n", "ratings.dat line 2: unknown user id '3' (not in users.dat)"),
        ("1::5::5::1\n", "ratings.dat line 1: unknown item id '5' (not in movies.dat)"),
    ],
)
def test_ml1m_malformed_names_file_and_line(tmp_path: Path, ratings: str, message: str) -> None:
    with pytest.raises(DataError) as err:
        load_dataset(write_ml1m(tmp_path / "one", ratings=ratings))
    assert message in str(err.value)


@pytest.mark.ml100k
def test_real_ml100k(ml100k_dir: Path) -> None:
    assert detect_format(ml100k_dir) == "ml-100k"
    ds = load_dataset(ml100k_dir)
    assert (len(ds.interactions), len(ds.items), len(ds.users)) == (100_000, 1682, 943)
    toy = ds.items.set_index("item_id").loc["1"]
    assert toy["title"] == "Toy Story (1995)"
    assert toy["categories"] == ["Animation", "Children's", "Comedy"]
    assert toy["year"] == 1995
    assert ds.items.set_index("item_id").loc["543", "title"] == "Misérables, Les (1995)"
    assert ds.interactions["rating"].between(1, 5).all()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"u.genre": "unknown|0\nAction|99999999999999999999\n"},
         "u.genre line 2: genre index '99999999999999999999' is too large (an integer must be below 2**53)"),
        ({"u.user": "1|99999999999999999999|M|technician|85711\n"}, "u.user line 1: age '99999999999999999999' is too large"),
        ({"u.data": "1\t1\t5\t1\n1\t2\t5\t1e30\n"}, "u.data line 2: timestamp '1e30' is outside the supported range"),
        ({"u.data": "1\t1\t1e300\t1\n"}, "u.data line 1: rating '1e300' is too large"),
        ({"u.data": "1\t1\x00\t5\t1\n"}, r"u.data line 1: item id '1\x00' contains a control character"),
        ({"u.item": ITEMS.replace("3|unknown|", "3\x853|unknown|")}, r"u.item line 3: item id '3\x853' contains a control"),
        ({"u.data": "1\t1\t5\t1\r1\t2\t3\t2\r7\t1\t5\t2\r"}, "u.data line 3: unknown user id '7'"),  # CR-only lines
    ],
)
def test_ml100k_hostile_values_name_file_and_line(tmp_path: Path, override: dict[str, str], message: str) -> None:
    with pytest.raises(DataError) as err:
        load_dataset(write_ml100k(tmp_path / "ml", **override))
    assert message in str(err.value)


def test_ml100k_cr_only_line_ends_load(tmp_path: Path) -> None:
    cr = {name: text.replace("\n", "\r") for name, text in
          {"u.genre": GENRES, "u.item": ITEMS, "u.user": USERS, "u.data": DATA}.items()}
    ds = load_dataset(write_ml100k(tmp_path / "ml", **cr))
    assert ds.interactions["timestamp"].tolist() == [881250949, 881250950, 881250000]
    assert ds.items["item_id"].tolist() == ["1", "2", "3"]


def test_ml1m_huge_age_code_names_the_line(tmp_path: Path) -> None:
    root = write_ml1m(tmp_path / "one")
    (root / "users.dat").write_bytes(b"1::F::1::10::48067\n2::M::99999999999999999999::16::70072\n")
    with pytest.raises(DataError, match=r"users.dat line 2: age code '99999999999999999999' is too large"):
        load_dataset(root)


def write_movietweetings(root: Path) -> Path:
    """MovieTweetings' published layout: ML-1M's file names, 0-10 ratings, IMDb ids, a movie without a
    genre, and a ``users.dat`` of ``user_id::twitter_id``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "ratings.dat").write_text("1::0000008::10::1381620027\n1::0000010::6::1379466669\n"
                                      "2::0000008::7::1392422050\n3::0000012::0::1362946800\n")
    (root / "movies.dat").write_text("0000008::Edison Kinetoscopic Record of a Sneeze (1894)::Documentary|Short\n"
                                     "0000010::La sortie des usines Lumière (1895)::Documentary|Short\n"
                                     "0000012::The Arrival of a Train (1896)::\n")
    (root / "users.dat").write_text("1::139564917\n2::17528189\n3::522540374\n")
    return root


def test_a_users_file_of_another_layout_gives_the_user_ids_and_a_warning(tmp_path: Path, caplog) -> None:
    with caplog.at_level("WARNING"):
        ds = load_dataset(write_movietweetings(tmp_path / "movietweetings"))
    assert ds.users["user_id"].tolist() == ["1", "2", "3"]
    assert ds.users["age"].isna().all() and ds.users["gender"].isna().all()
    assert ds.interactions["rating"].tolist() == [10.0, 6.0, 7.0, 0.0]
    assert ds.items["categories"].tolist() == [["Documentary", "Short"], ["Documentary", "Short"], []]
    assert ds.items["title"].iloc[1] == "La sortie des usines Lumière (1895)"  # UTF-8, as MovieTweetings writes it
    [warning] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warning == ("users.dat: 2 '::'-separated field(s) per line, not ML-1M's 5 (user_id::gender::age::"
                       "occupation::zip): the first was read as the user id, the rest not; the users have no "
                       "attributes (age, gender, occupation)")


@pytest.mark.parametrize(("users", "message"), [
    ("1::139564917\n2::17528189::x\n", "users.dat line 2: expected 2 '::'-separated fields, got 3"),
    ("1::139564917\n1::17528189\n", "users.dat line 2: duplicate user id '1'"),
    ("1::139564917\n2::17528189\n", "ratings.dat line 4: unknown user id '3' (not in users.dat)"),
])
def test_a_users_file_of_another_layout_is_still_checked_line_by_line(tmp_path: Path, users: str,
                                                                      message: str) -> None:
    root = write_movietweetings(tmp_path / "movietweetings")
    (root / "users.dat").write_text(users)
    with pytest.raises(DataError) as err:
        load_dataset(root)
    assert message in str(err.value)


def test_a_dat_file_in_latin_1_still_reads_as_grouplens_writes_it(tmp_path: Path) -> None:
    root = write_movietweetings(tmp_path / "ml1m-latin1")
    (root / "movies.dat").write_bytes("0000008::Amélie (2001)::Comedy\n0000010::Zoë (1995)::Drama\n"
                                      "0000012::Heat (1995)::\n".encode("latin-1"))
    assert load_dataset(root).items["title"].tolist() == ["Amélie (2001)", "Zoë (1995)", "Heat (1995)"]
