"""``recsys prepare`` and the split it saves: reports, reuse, kept options, and which dataset it is."""

import json
from pathlib import Path

from typer.testing import CliRunner

from cli.main import app
from tests.cli.test_cli import _one_line_error

runner = CliRunner()


def test_prepare_synthetic_writes_a_report(tmp_path: Path):
    out = tmp_path / "r" / "prepare.json"
    art = tmp_path / "art"
    args = ["prepare", "--artifacts", str(art), "--synthetic-users", "60", "--synthetic-items", "120", "--out", str(out)]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    assert report["dataset"] == "synthetic" and report["n_users"] == 60
    assert report["protocol"]["k_core"] == 5
    assert (art / "split" / "split.json").exists()
    # a second run with the same inputs reuses the split (same report, no rebuild)
    mtime = (art / "split" / "train.parquet").stat().st_mtime_ns
    assert runner.invoke(app, args).exit_code == 0
    assert (art / "split" / "train.parquet").stat().st_mtime_ns == mtime


def test_a_prepared_k_core_and_size_hold_until_an_option_changes_them(tmp_path: Path, caplog):
    art = ["--artifacts", str(tmp_path / "art")]
    first = ["prepare", *art, "--synthetic-users", "60", "--synthetic-items", "120", "--k-core", "3"]
    assert runner.invoke(app, first).exit_code == 0
    mtime = (tmp_path / "art" / "split" / "train.parquet").stat().st_mtime_ns
    again = runner.invoke(app, ["prepare", *art, "--out", str(tmp_path / "p.json")])  # as train and eval do
    assert again.exit_code == 0 and "rebuilt" not in again.output, again.output
    assert json.loads((tmp_path / "p.json").read_text())["protocol"]["k_core"] == 3
    assert (tmp_path / "art" / "split" / "train.parquet").stat().st_mtime_ns == mtime  # reused, not rebuilt
    with caplog.at_level("WARNING"):
        assert runner.invoke(app, ["prepare", *art, "--k-core", "5"]).exit_code == 0
    assert "the split was rebuilt (k_core 3 -> 5)" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):  # another dataset in the same directory is said too
        assert runner.invoke(app, ["prepare", *art, "--data", str(_tiny_generic(tmp_path / "shop"))]).exit_code == 0
    assert "the split was rebuilt (dataset 'synthetic' -> 'shop')" in caplog.text


def _tiny_generic(root: Path) -> Path:
    root.mkdir(parents=True)
    rows = [f"u{u},i{(u + j) % 12},{1000 + j}" for u in range(30) for j in range(8)]
    (root / "interactions.csv").write_text("user_id,item_id,timestamp\n" + "\n".join(rows) + "\n")
    return root


def test_prepare_reports_malformed_data_by_file_and_line(tmp_path: Path):
    data = tmp_path / "d"
    data.mkdir()
    (data / "interactions.csv").write_text("user_id,item_id,rating,timestamp\nu1,i1,5,100\nu1,i2,x,101\n")
    (data / "items.csv").write_text("item_id,title\ni1,A\ni2,B\n")
    res = runner.invoke(app, ["prepare", "--data", str(data), "--artifacts", str(tmp_path / "a")])
    assert res.exit_code == 2
    assert "interactions.csv line 3" in res.output


def test_recommend_refuses_artifacts_of_another_dataset_than_data(tmp_path: Path):
    art = tmp_path / "art"
    assert runner.invoke(app, ["prepare", "--artifacts", str(art), "--synthetic-users", "60",
                               "--synthetic-items", "120"]).exit_code == 0
    (tmp_path / "wine").mkdir()
    res = runner.invoke(app, ["recommend", "u1", "--data", str(tmp_path / "wine"), "--artifacts", str(art)])
    _one_line_error(res, "holds the cascade of dataset 'synthetic', whose files differ from those of --data")


def test_recommend_knows_a_dataset_by_its_files_not_its_name(tmp_path: Path):
    import shutil

    shop = _tiny_generic(tmp_path / "a" / "shop")
    art = tmp_path / "art"
    assert runner.invoke(app, ["prepare", "--data", str(shop), "--artifacts", str(art)]).exit_code == 0
    other = _tiny_generic(tmp_path / "b" / "shop")  # same name, other files
    (other / "interactions.csv").write_text((other / "interactions.csv").read_text() + "u0,i11,99999\n")
    res = runner.invoke(app, ["recommend", "u1", "--data", str(other), "--artifacts", str(art)])
    _one_line_error(res, "whose files differ from those of --data")
    copy = shutil.copytree(shop, tmp_path / "backup")  # another name, the same files: not refused for that
    res = runner.invoke(app, ["recommend", "u1", "--data", str(copy), "--artifacts", str(art)])
    assert "files differ" not in res.output


def test_a_refreshed_dataset_keeps_its_catalog_and_k_core_and_the_note_says_so(tmp_path: Path, caplog):
    """A shop prepared with `--catalog listed --k-core 3` that lists one more product (or logs one more
    event) keeps its listed 3-core catalog on its next `train` (not the interacted 5-core one, which drops
    the new product and every other event-less one), and the note says what was kept."""
    shop = _tiny_generic(tmp_path / "shop")
    items = ["item_id,title"] + [f"i{i},Product {i}" for i in range(12)] + ["i90,Never bought"]
    (shop / "items.csv").write_text("\n".join(items) + "\n")
    art = ["--data", str(shop), "--artifacts", str(tmp_path / "art"), "--out", str(tmp_path / "p.json")]
    assert runner.invoke(app, ["prepare", *art, "--catalog", "listed", "--k-core", "3"]).exit_code == 0
    assert json.loads((tmp_path / "p.json").read_text())["n_items"] == 13
    (shop / "items.csv").write_text("\n".join([*items, "i91,Listed today"]) + "\n")  # the next export
    with caplog.at_level("WARNING"):
        assert runner.invoke(app, ["prepare", *art]).exit_code == 0
    protocol = json.loads((tmp_path / "p.json").read_text())["protocol"]
    assert (protocol["catalog"], protocol["k_core"], protocol["n_items"]) == ("listed", 3, 14)
    assert ("the split was rebuilt (the files of dataset 'shop' changed, kept: k_core 3, catalog listed "
            "(give --k-core/--catalog to change it))") in caplog.text
    caplog.clear()
    (shop / "items.csv").write_text("\n".join([*items, "i91,Listed today", "i92,Listed later"]) + "\n")
    with caplog.at_level("WARNING"):  # an option given changes it, and is not said to be kept
        assert runner.invoke(app, ["prepare", *art, "--catalog", "interacted"]).exit_code == 0
    assert "(the files of dataset 'shop' changed, catalog listed -> interacted, kept: k_core 3 (give --k-core" in caplog.text
    assert json.loads((tmp_path / "p.json").read_text())["n_items"] == 12


def test_a_dataset_exported_under_another_name_into_the_same_artifacts_keeps_the_options(tmp_path: Path, caplog):
    """A date-stamped export (shop_2024_06, then shop_2024_07) into one artifact directory keeps the
    options it was prepared with, rather than going back to the interacted 5-core catalog."""
    june = _tiny_generic(tmp_path / "shop_2024_06")
    (june / "items.csv").write_text("item_id,title\n" + "".join(f"i{i},P{i}\n" for i in range(12)) + "i90,New\n")
    art = ["--artifacts", str(tmp_path / "art"), "--out", str(tmp_path / "p.json")]
    assert runner.invoke(app, ["prepare", "--data", str(june), *art, "--catalog", "listed", "--k-core", "3"]).exit_code == 0
    july = _tiny_generic(tmp_path / "shop_2024_07")
    (july / "items.csv").write_text((june / "items.csv").read_text() + "i91,Newer\n")
    with caplog.at_level("WARNING"):
        assert runner.invoke(app, ["prepare", "--data", str(july), *art]).exit_code == 0
    protocol = json.loads((tmp_path / "p.json").read_text())["protocol"]
    assert (protocol["catalog"], protocol["k_core"], protocol["n_items"]) == ("listed", 3, 14)
    assert ("(dataset 'shop_2024_06' -> 'shop_2024_07', kept: k_core 3, catalog listed "
            "(give --k-core/--catalog to change it))") in caplog.text
