"""The items held out of adaptation travel with the adapted model: a failed adaptation changes neither,
and a tagging run scores as held out exactly the items that model never trained on."""

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from jobs.tagging.adapt import AdaptSettings
from jobs.tagging.generate import TaggerSettings
from jobs.tagging.run import TagOptions, adapt_tagger_for, tag_catalog
from tests.jobs.tagging.factories import catalog_split, prepared_again, tiny_model_dir

TINY = AdaptSettings(epochs=1, batch_size=2, max_items=2, seed=0, threads=1, autocast_bf16=False)
FP32 = TaggerSettings(precision="fp32", max_new_tokens=80, threads=1)


def _items(path: Path) -> list[int]:
    return json.loads(path.read_text())["items"]


@pytest.fixture(scope="module")
def adapted_once(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Artifacts whose tiny tagger is adapted on half of an 8-item catalog: one adaptation for the module."""
    root = tmp_path_factory.mktemp("adapted")
    adapt_tagger_for(catalog_split(8), str(tiny_model_dir()), root, TINY, holdout_fraction=0.5, progress=False)
    return root


@pytest.fixture
def adapted(adapted_once: Path, tmp_path: Path) -> tuple[Path, list[int]]:
    """(tags folder, held-out items) of a copy of ``adapted_once`` in the test's own folder."""
    shutil.copytree(adapted_once, tmp_path, dirs_exist_ok=True)
    tags = tmp_path / "tags"
    held = _items(tags / "holdout.json")
    assert len(held) == 4
    return tags, held


def test_an_adaptation_that_fails_leaves_the_model_s_holdout_and_the_tag_run_scores_it(
        adapted: tuple[Path, list[int]], tmp_path: Path):
    tags, held = adapted
    weights = (tags / "model" / "model.safetensors").read_bytes()
    with pytest.raises(ValueError, match="learning rate"):  # fails inside the adaptation, after it started
        adapt_tagger_for(catalog_split(8), str(tiny_model_dir()), tmp_path, replace(TINY, lr=-1.0),
                         holdout_fraction=0.75, progress=False)
    assert _items(tags / "holdout.json") == held
    assert (tags / "model" / "model.safetensors").read_bytes() == weights
    assert _items(tags / "model" / "holdout.json") == held  # the list travels with the model it was made for
    summary = tag_catalog(catalog_split(8), str(tags / "model"), tmp_path, FP32,
                          TagOptions(chunk_size=4, batch_size=4,
                                     progress=False))
    assert summary["items_heldout"] == 4 and summary["items_adapted_on"] == 4


def test_a_holdout_list_beside_the_model_that_is_not_its_own_is_replaced_by_the_model_s(
        adapted: tuple[Path, list[int]], tmp_path: Path):
    tags, held = adapted
    # what a killed `recsys tag adapt --holdout 0.75` left before this change: a new list, the old model
    (tags / "holdout.json").write_text(json.dumps({"fraction": 0.75, "seed": 0, "items": [0, 1, 2, 3, 4, 5]}))
    summary = tag_catalog(catalog_split(8), str(tags / "model"), tmp_path, FP32,
                          TagOptions(chunk_size=4, batch_size=4,
                                     progress=False))
    assert summary["items_heldout"] == 4
    assert _items(tags / "holdout.json") == held


def test_a_model_adapted_on_the_catalog_before_prepare_ran_again_is_refused_before_tagging(
        adapted: tuple[Path, list[int]], tmp_path: Path):
    tags, _ = adapted
    with pytest.raises(ValueError, match=r"model/holdout.json: the model was adapted on another catalog .*"
                                         r"re-run `recsys tag adapt`"):
        tag_catalog(prepared_again(catalog_split(8)), str(tags / "model"), tmp_path, FP32,
                    TagOptions(chunk_size=4,
                               batch_size=4, progress=False))
    assert not (tags / "parts").exists()
