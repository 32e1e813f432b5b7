"""Generic-layout values that are refused by name, and ids read in their one spelling (``recsys.names``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from offline.loaders import load_dataset
from offline.schema import DataError
from tests.offline.test_loaders_csv import GENERIC_ITEMS, write_generic


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"items.csv": GENERIC_ITEMS.replace(",2020,", ",99999999999999999999,")},
         "items.csv line 2: year '99999999999999999999' is too large"),
        ({"interactions.csv": "user_id,item_id,timestamp\nx,a,1\nx,b,1e30\n"},
         "interactions.csv line 3: timestamp '1e30' is outside the supported range 1677-09-21..2262-04-11"),
        ({"interactions.csv": "user_id,item_id,timestamp\nx,a,99999999999999999999\n"},
         "interactions.csv line 2: timestamp '99999999999999999999' is outside the supported range"),
        ({"interactions.csv": "user_id,item_id,timestamp\nx,a,1609459200000\n"},
         "timestamp '1609459200000' is outside the supported range 1677-09-21..2262-04-11 UTC "
         "(unix seconds -9223372036..9223372036) (milliseconds? divide by 1000)"),
        ({"interactions.csv": "user_id,item_id,timestamp\nx,a,1\nx,b,1500.7\n"},
         "interactions.csv line 3: timestamp '1500.7' is not a whole number of seconds"),
        ({"interactions.csv": "user_id,item_id,rating,timestamp\nx,a,4,1\nx,b,1e300,2\n"},
         "interactions.csv line 3: rating '1e300' is too large (float32 holds at most 3.4e38)"),
        ({"interactions.csv": "user_id,item_id,timestamp\nx,a,2021-01-01T00:00:00Z\nx,b,9999-01-01T00:00:00Z\n"},
         "interactions.csv line 3: timestamp '9999-01-01T00:00:00Z' is outside the supported range"),
        ({"interactions.csv": "user_id,item_id,timestamp\nx,a,0001-01-01\n"},
         "interactions.csv line 2: timestamp '0001-01-01' is outside the supported range"),
        ({"interactions.csv": "user_id,item_id,timestamp,timestamp\nx,a,1,2\n"},
         "interactions.csv line 1: duplicate column name(s) ['timestamp']"),
        ({"items.csv": "item_id,title,title,year,year\na,A,B,1,2\nb,,,,\n"},
         "items.csv line 1: duplicate column name(s) ['title', 'year']"),
        ({"items.csv": "item_id,_line\na,1\nb,2\n"}, "items.csv line 1: column name '_line' is reserved"),
        ({"interactions.csv": "user_id,item_id,timestamp\nx,a,1\nx\x00y,b,2\n"},
         r"interactions.csv line 3: user id 'x\x00y' contains a control character"),
        ({"items.csv": GENERIC_ITEMS.replace("b,Beta", '"b\x1b",Beta')}, r"items.csv line 3: item id 'b\x1b' contains a control"),
        # ids that print alike must be one id: invisible format characters are refused like control ones
        ({"interactions.csv": "user_id,item_id,timestamp\nalice,a,1\nalice\u200b,b,2\n"},
         r"interactions.csv line 3: user id 'alice\u200b' contains an invisible format character "
         "(U+200B ZERO WIDTH SPACE at 5)"),
        ({"interactions.csv": "user_id,item_id,timestamp\n" + "x" * 513 + ",a,1\n"},
         "interactions.csv line 2: user id 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx... is 513 characters long "
         "(at most 512)"),
        ({"items.csv": GENERIC_ITEMS.replace("b,Beta", "\u202eb,Beta")},
         r"items.csv line 3: item id '\u202eb' contains an invisible format character (U+202E RIGHT-TO-LEFT OVERRIDE at 0)"),
    ],
)
def test_generic_hostile_values_name_file_and_line(tmp_path: Path, files: dict[str, str], message: str) -> None:
    with pytest.raises(DataError) as err:
        load_dataset(write_generic(tmp_path / "g", **files))
    assert message in str(err.value)


def test_ids_spelt_in_decomposed_unicode_are_the_catalogs_ids(tmp_path: Path) -> None:
    # a decomposed "é" (e + combining acute: macOS file names, some exports) and the precomposed one
    # print alike; before NFC the load stopped at "unknown item id 'café'"
    nfd, nfc = "cafe\u0301", "caf\u00e9"
    root = write_generic(tmp_path / "g", **{
        "items.csv": f"item_id,title\n{nfc},Coffee\nb,Beta\n",
        "interactions.csv": f"user_id,item_id,timestamp\nJos{'e' + chr(0x301)},{nfd},1\nJos\u00e9,b,2\n"})
    ds = load_dataset(root)
    assert ds.items["item_id"].tolist() == [nfc, "b"]
    assert ds.interactions["item_id"].tolist() == [nfc, "b"]
    assert ds.interactions["user_id"].tolist() == ["Jos\u00e9"] * 2  # one user, not two
    # category names too: the rules and the category features match them exactly
    root = write_generic(tmp_path / "c", **{"items.csv": "item_id,title,categories\na,A,Come\u0301die|Drame\n"
                                                          "b,B,Com\u00e9die\n"})
    assert load_dataset(root).items["categories"].tolist() == [["Com\u00e9die", "Drame"], ["Com\u00e9die"]]
    # two spellings of one id in the catalog are one id twice
    root = write_generic(tmp_path / "h", **{"items.csv": f"item_id,title\n{nfc},A\n{nfd},B\n"})
    with pytest.raises(DataError, match="duplicate"):
        load_dataset(root)
