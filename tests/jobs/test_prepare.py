"""``jobs.prepare``: the split follows the dataset's content, survives an interrupted rebuild, and says
what the catalog leaves out."""

import json
from pathlib import Path

import pytest

from cascade.settings import Settings
from jobs.prepare import prepare
from jobs.train import train_stages
from tests.jobs.test_train import TINY


def test_split_fingerprint_follows_content_not_mtime_or_path(tmp_path):
    import os

    from jobs.prepare import _fingerprint

    data = tmp_path / "a" / "ml-100k"
    data.mkdir(parents=True)
    (data / "u.data").write_text("1\t1\t5\t881250949\n")
    first = _fingerprint(data, None, 5, {})
    os.utime(data / "u.data", (1, 1))  # a restored copy: same bytes, new mtime
    copy = tmp_path / "b" / "ml-100k"
    copy.mkdir(parents=True)
    (copy / "u.data").write_bytes((data / "u.data").read_bytes())
    assert _fingerprint(data, None, 5, {}) == first == _fingerprint(copy, None, 5, {})
    (data / "u.data").write_text("1\t1\t4\t881250949\n")  # one changed byte, same size
    assert _fingerprint(data, None, 5, {}) != first


def test_an_interrupted_prepare_leaves_no_split_rather_than_a_mixed_one(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import pandas as pd

    from offline.split import Split

    art = tmp_path / "synthetic"
    old = prepare(None, art, n_users=30, n_items=40, seed=3)
    real = pd.DataFrame.to_parquet
    written: list[int] = []

    def killed_at_the_train_table(frame: pd.DataFrame, *args: object, **kwargs: object) -> None:
        if "user_idx" in frame.columns:  # the train table: items and users are already new
            raise KeyboardInterrupt  # stands in for a kill
        written.append(len(frame))
        real(frame, *args, **kwargs)

    monkeypatch.setattr(pd.DataFrame, "to_parquet", killed_at_the_train_table)
    with pytest.raises(KeyboardInterrupt):
        prepare(None, art, n_users=30, n_items=40, seed=4)
    monkeypatch.undo()
    assert len(written) == 2  # the new items and users tables replaced the old ones ...
    with pytest.raises(FileNotFoundError, match="no saved split here"):  # ... but nothing vouches for them
        Split.load(art / "split")
    assert not (art / "split" / "source.json").exists()
    assert not [p.name for p in (art / "split").iterdir() if p.name.startswith(".")]  # no temporary file left
    again = prepare(None, art, n_users=30, n_items=40, seed=4)  # the next prepare starts over
    assert Split.load(art / "split").vocab.item_ids.tolist() == again.vocab.item_ids.tolist()
    assert prepare(None, art, n_users=30, n_items=40, seed=4).train.equals(again.train)  # and is reused
    assert not again.items.equals(old.items)


def test_prepare_adds_the_outside_users_to_a_split_saved_before_them_and_keeps_its_id(tmp_path: Path) -> None:
    from offline.split import OUTSIDE_FILE, split_id

    art = tmp_path / "synthetic"
    prepare(None, art, n_users=30, n_items=40, seed=3)
    before = split_id(art)
    (art / "split" / OUTSIDE_FILE).unlink()  # as a split saved by an earlier release
    assert prepare(None, art, n_users=30, n_items=40, seed=3).outside is not None
    assert (art / "split" / OUTSIDE_FILE).is_file() and split_id(art) == before  # no stage goes stale


@pytest.mark.parametrize("record", ["[]", '"x"', '{"data": "synthetic", "k_core": "3"}', '{"data": "synthetic", "k_'])
def test_prepare_rebuilds_over_a_source_record_that_is_not_one(tmp_path: Path, record: str) -> None:
    from jobs.prepare import recorded_source

    art = tmp_path / "synthetic"
    prepare(None, art, n_users=30, n_items=40, seed=3)
    (art / "split" / "source.json").write_text(record)
    assert recorded_source(art) == {}
    assert prepare(None, art, n_users=30, n_items=40, seed=3).n_users > 0
    assert recorded_source(art)["k_core"] == 5


def test_catalog_left_out_docstring() -> None:
    import doctest

    import jobs.prepare

    tests = doctest.DocTestFinder().find(jobs.prepare.catalog_left_out, "catalog_left_out", globs=vars(jobs.prepare))
    assert tests and all(doctest.DocTestRunner().run(t).failed == 0 for t in tests)  # pytest runs no doctests


def test_prepare_says_which_listed_items_the_catalog_leaves_out(tmp_path: Path, caplog) -> None:
    data = tmp_path / "shop"
    data.mkdir()
    rows = [f"u{u},i{(u + j) % 8},{100 * u + j}" for u in range(12) for j in range(6)]
    (data / "interactions.csv").write_text("user_id,item_id,timestamp\n" + "\n".join([*rows, "u0,rare,9999"]) + "\n")
    (data / "items.csv").write_text("item_id,title\n" + "".join(f"i{i},Item {i}\n" for i in range(8))
                                    + "rare,Rare\nnew,Brand new\n")
    with caplog.at_level("WARNING"):
        split = prepare(data, tmp_path / "art")
    assert split.n_items == 8
    assert ("2 of 10 listed items are left out of the catalog and are never recommended: 1 with no event "
            "(--catalog listed keeps such items, as new ones), 1 removed by the 5-core filter") in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        prepare(data, tmp_path / "art")  # reused: said once, when the split is built
    assert "left out" not in caplog.text


def test_a_listed_catalog_is_kept_until_given_otherwise_and_its_new_items_are_recalled(tmp_path: Path, caplog) -> None:
    from recall.stage import RecallStage
    from recsys.config import StageSpec
    from recsys.contract import Request

    data = tmp_path / "shop"
    data.mkdir()
    rows = [f"u{u},i{(u + j) % 8},{100 * u + j}" for u in range(12) for j in range(6)]
    (data / "interactions.csv").write_text("user_id,item_id,timestamp\n" + "\n".join(rows) + "\n")
    (data / "items.csv").write_text("item_id,title,categories\n" + "".join(f"i{i},Item {i},A\n" for i in range(8))
                                    + "new,Brand new,A\n")
    art = tmp_path / "art"
    assert prepare(data, art).n_items == 8
    with caplog.at_level("WARNING"):
        split = prepare(data, art, catalog="listed")
    assert "catalog interacted -> listed" in caplog.text
    assert split.n_items == 9 and split.items["item_id"].iloc[8] == "new"
    assert prepare(data, art).n_items == 9  # train and eval without --catalog keep the prepared one
    settings = Settings.build(TINY)  # recall's depth (200) is past the whole catalog
    train_stages(settings, art, split, stages=("recall",))
    recall = RecallStage(StageSpec(name="recall", kind="recall", on_error="fail"), settings.recall)
    recall.load(art)
    out = recall.run(Request(user_id="u0", user_idx=0, history=split.history(0, "test"), k=9), None)
    assert 8 in out.items.tolist()  # the new item is in the index, reachable by its content


def test_a_split_prepared_by_older_loaders_is_prepared_again(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A loader fix (how a categories cell is read) left the old reading in a reused split until it was deleted."""
    from offline.loaders import LOADER_REVISION
    from tests.offline.test_loaders_csv import write_generic

    rows = "".join(f"u{u},i{(u + n) % 9},{n}\n" for u in range(12) for n in range(6))
    items = "item_id,title,categories\n" + "".join(f"i{i},Item {i},A|B\n" for i in range(9))
    data = write_generic(tmp_path / "shop", **{"interactions.csv": "user_id,item_id,timestamp\n" + rows,
                                               "items.csv": items})
    art = tmp_path / "art"
    prepare(data, art, k_core=1)
    source = art / "split" / "source.json"
    assert json.loads(source.read_text())["loader_revision"] == LOADER_REVISION
    old = {k: v for k, v in json.loads(source.read_text()).items() if k != "loader_revision"}  # as written before
    source.write_text(json.dumps(old))
    with caplog.at_level("WARNING"):
        prepare(data, art, k_core=1)
    assert json.loads(source.read_text())["loader_revision"] == LOADER_REVISION
    assert any(f"the loaders read these files differently now (revision 1 -> {LOADER_REVISION})" in r.getMessage()
               for r in caplog.records)


def test_the_prompt_word_for_an_item_follows_the_layout_the_split_was_prepared_from(tmp_path: Path) -> None:
    from offline.split import prepared_item_noun

    rows = [(u, (u + j) % 8, 100 * u + j) for u in range(12) for j in range(6)]
    films = tmp_path / "exported-ratings"  # a MovieLens CSV release under a name that says nothing
    films.mkdir()
    (films / "ratings.csv").write_text("userId,movieId,rating,timestamp\n"
                                       + "".join(f"{u},{i},4.0,{t}\n" for u, i, t in rows))
    (films / "movies.csv").write_text("movieId,title,genres\n" + "".join(f"{i},Film {i} (1999),Drama\n" for i in range(8)))
    shop = tmp_path / "shop"
    shop.mkdir()
    (shop / "interactions.csv").write_text("user_id,item_id,timestamp\n"
                                           + "".join(f"u{u},i{i},{t}\n" for u, i, t in rows))
    prepare(films, tmp_path / "a")
    prepare(shop, tmp_path / "b")
    prepare(films, tmp_path / "c", fmt="ml-csv")
    prepare(None, tmp_path / "d", n_users=30, n_items=40, seed=3)
    assert [prepared_item_noun(tmp_path / n) for n in "abcd"] == ["movie", "item", "movie", "movie"]
    assert prepared_item_noun(tmp_path / "nothing-prepared") == "item"
    (tmp_path / "b" / "split" / "source.json").write_text('{"derived_from": "x", "item_noun": "film"}')
    assert prepared_item_noun(tmp_path / "b") == "film"  # a derived split (the cold-item cascade's) keeps its parent's
    assert prepared_item_noun(tmp_path / "a", "product") == "product"  # a configured llm.domain wins
    assert prepared_item_noun(tmp_path / "a", "") == "movie"  # an empty one is no word
