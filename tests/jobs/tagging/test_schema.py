import json

import numpy as np
import pytest

from jobs.tagging.embed import cooccurrence_pairs
from jobs.tagging.prompt import PREFILL, prompt_description, target_completion
from jobs.tagging.quality import genre_f1, holdout_items
from jobs.tagging.schema import (
    catalog_categories,
    concrete_schema,
    enum_of,
    fallback_record,
    parse_and_validate,
    schema_hash,
    validation_errors,
)

GOOD = {"genres": ["Drama", "Drama", "Comedy"], "audience": "teen", "risk_flags": [], "themes": ["funny"],
        "summary": "Two friends open a shop."}


def test_genre_enum_comes_from_the_catalog_and_changes_the_hash():
    cats = catalog_categories([["Drama"], ["Comedy", "Drama"], []])
    schema = concrete_schema(cats)
    assert enum_of(schema, "genres") == ["Comedy", "Drama"]
    assert enum_of(schema, "audience") == ["all", "teen", "adult"]
    assert schema_hash(schema) != schema_hash(concrete_schema(["Comedy", "Drama", "Horror"]))
    with pytest.raises(ValueError, match="no categories"):
        catalog_categories([[], []])


def test_valid_record_is_deduplicated_and_invalid_ones_say_why():
    schema = concrete_schema(["Comedy", "Drama"])
    record, reason = parse_and_validate(json.dumps(GOOD), schema)
    assert reason == "" and record is not None
    assert record["genres"] == ["Drama", "Comedy"]
    bad = dict(GOOD, genres=["Western"])
    assert parse_and_validate(json.dumps(bad), schema)[0] is None
    assert "Western" in parse_and_validate(json.dumps(bad), schema)[1]
    assert parse_and_validate('{"genres": ["Dra', schema)[1].startswith("not JSON")
    long = dict(GOOD, summary="x" * 61)
    assert validation_errors(long, schema) and not validation_errors(GOOD, schema)
    fb = fallback_record("budget")
    assert fb["fallback"] is True and fb["reason"] == "budget" and fb["genres"] == []


def test_prompt_never_shows_category_labels_and_target_opens_after_prefill():
    desc = prompt_description("Heat (1995)", "Heat (1995). Genres: Action, Crime. A crime saga. Pacino stars.",
                              ["Action", "Crime"], 100)
    assert desc == "Pacino stars."
    completion = target_completion({"genres": ["Comedy"], "audience": "all", "risk_flags": []})
    assert PREFILL + completion == '{"genres": ["Comedy"], "audience": "all", "risk_flags": [], '
    with pytest.raises(ValueError, match="genres"):
        target_completion({"genres": []})


def test_genre_f1_by_hand():
    # item0: tp A; item1: fp A, tp B; item2: fn C  -> micro = 2*2/(2*2+1+1) = 0.6667
    r = genre_f1([["A"], ["A", "B"], []], [["A"], ["B"], ["C"]], ["A", "B", "C"])
    assert r["micro"] == pytest.approx(4 / 6)
    assert r["macro"] == pytest.approx((2 / 3 + 1.0 + 0.0) / 3)
    with pytest.raises(ValueError, match="2 predictions for 1"):
        genre_f1([[], []], [[]], ["A"])


def test_holdout_is_seeded_half():
    a, b = holdout_items(10, 0.5, 7), holdout_items(10, 0.5, 7)
    assert a.tolist() == b.tolist() and len(a) == 5 and np.all(np.diff(a) > 0)
    with pytest.raises(ValueError, match="fraction"):
        holdout_items(10, 1.0, 0)


def test_cooccurrence_pairs_are_consecutive_train_items():
    assert cooccurrence_pairs([np.array([4, 2, 9]), np.array([1])]).tolist() == [[4, 2], [2, 9]]
