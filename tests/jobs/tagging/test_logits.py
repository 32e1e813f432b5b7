"""Tagging by label logits (jobs.tagging.logits) on tiny random models of every packaged backbone architecture."""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from jobs.tagging.generate import GrammarLogits, TaggerSettings
from jobs.tagging.job import item_rows
from jobs.tagging.logits import LogitTagger, greedy_continue, tag_items
from jobs.tagging.run import TagOptions, tag_catalog
from jobs.tagging.schema import catalog_categories, concrete_schema, validation_errors
from llm_rerank.forward import row_logits
from offline.tag_store import load_tags
from tests.jobs.tagging.factories import catalog_split, tiny_model_dir
from tests.llm_rerank.factories import ARCHITECTURES, CONVERTED, save_tiny_llm

SETTINGS = TaggerSettings(precision="fp32", max_new_tokens=12, threads=1)


@functools.cache
def tiny_dir(arch: str) -> str:
    return str(save_tiny_llm(Path(tempfile.mkdtemp(prefix=f"tiny-logits-{arch}-")), arch=arch))


@functools.cache
def loaded(arch: str) -> LogitTagger:
    split = catalog_split(4)
    return LogitTagger(tiny_dir(arch), concrete_schema(catalog_categories(split.items["categories"])), SETTINGS).load()


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_cached_read_out_equals_one_uncached_pass_over_the_whole_prompt(arch: str) -> None:
    tagger = loaded(arch)
    lay = tagger.layout
    rows = item_rows(catalog_split(4).items, ["Animation", "Children's", "Horror"], 0, 3)
    cached = tagger.label_probs(rows)
    for i, row in enumerate(rows):
        full = [lay.instruction + lay.item(row["title"], row["description"]) + list(r.tokens) for r in lay.rows]
        with torch.inference_mode():
            plain = lay.value_probs(row_logits(tagger.model, full, tagger.tok.pad_token_id))
        np.testing.assert_allclose(cached[i], plain, rtol=1e-4, atol=1e-6)
    for name, (start, stop) in lay.spans.items():  # each field's values share one unit of probability
        np.testing.assert_allclose(cached[:, start:stop].sum(1), 1.0, rtol=1e-5, err_msg=name)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_batched_free_text_equals_each_prompt_decoded_alone(arch: str) -> None:
    tagger = loaded(arch)
    lay = tagger.layout
    prompts = [lay.item(t, "") + lay.free_text_cue("summary") for t in ("Heat (1995)", "A much longer title (1999) x y z")]

    def decode(batch: list[list[int]]) -> list[list[int]]:
        processor = GrammarLogits(tagger.grammars["summary"], ['"'] * len(batch))
        return greedy_continue(tagger.model, tagger.instruction, batch, tagger.tok.pad_token_id, processor,
                               tagger.stop_ids, 10)

    together = decode(prompts)
    assert together == [decode([p])[0] for p in prompts]
    assert all(0 < len(t) <= 10 for t in together)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_free_text_from_the_item_caches_equals_running_the_items_again(arch: str) -> None:
    tagger = loaded(arch)
    rows = item_rows(catalog_split(4).items, ["Animation", "Children's", "Horror"], 0, 3)
    rows[1] = {**rows[1], "title": rows[1]["title"] + " with a much longer title than the others"}
    probs, pooled, states = tagger.read(rows)
    assert len(pooled) == 3 and all(p.shape == (tagger.model.config.hidden_size,) for p in pooled)
    assert not np.allclose(pooled[0], pooled[1])
    assert tagger.free_text(rows, "summary", states) == tagger.free_text(rows, "summary")


def test_every_document_is_schema_valid_and_held_out_labels_are_never_read(tmp_path: Path) -> None:
    split = catalog_split(12)
    summary = tag_catalog(split, str(tiny_model_dir()), tmp_path / "a", SETTINGS,
                          TagOptions(method="logits", chunk_size=5,
                                     batch_size=4, progress=False))
    tags, hidden, version = load_tags(tmp_path / "a" / "tags")
    schema = concrete_schema(catalog_categories(split.items["categories"]))
    assert summary["schema_valid_rate"] == 1.0 and summary["fallbacks"] == 0 and summary["method"] == "logits"
    assert version["method"] == "logits" and len(tags) == 12 and hidden.shape == (12, 32)
    for row in tags.itertuples():
        doc = json.loads(row.raw)
        assert validation_errors(doc, schema) == []
        assert list(doc) == ["genres", "audience", "risk_flags", "themes", "summary"]
        assert doc["genres"] == list(row.genres) and doc["summary"] == row.summary
    held = json.loads((tmp_path / "a" / "tags" / "holdout.json").read_text())["items"]
    assert len(held) == 6 and summary["calibrated_on_items"] == 6
    # scramble the held-out items' labels: calibration must not notice
    items = split.items.copy()
    items["categories"] = [["Horror"] if i in held else list(c) for i, c in enumerate(items["categories"])]
    (tmp_path / "b" / "tags").mkdir(parents=True)
    (tmp_path / "b" / "tags" / "holdout.json").write_text((tmp_path / "a" / "tags" / "holdout.json").read_text())
    scrambled = tag_catalog(type(split)(**{**split.__dict__, "items": items}), str(tiny_model_dir()), tmp_path / "b",
                            SETTINGS, TagOptions(method="logits", chunk_size=5, batch_size=4, progress=False))
    assert scrambled["thresholds"]["genres"] == summary["thresholds"]["genres"]
    pd.testing.assert_series_equal(load_tags(tmp_path / "b" / "tags")[0]["raw"], tags["raw"])


def test_tag_items_calibrates_only_on_known_rows() -> None:
    tagger = loaded("llama")
    rows = item_rows(catalog_split(6).items, ["Animation", "Children's", "Horror"], 0, 6)
    run = tag_items(tagger, rows, {0: ["Animation"], 1: ["Horror"]}, batch_size=4, progress=False)
    assert run.thresholds["genres"].items == 2 and run.thresholds["audience"].rule == "default"
    assert len(run.results) == 6 and run.probs.shape == (6, len(tagger.layout.slots))
    uncalibrated = tag_items(tagger, rows, {}, batch_size=4, progress=False)
    assert uncalibrated.thresholds["genres"].rule == "default"


def test_few_shot_examples_come_from_known_rows_only_and_sit_in_the_cached_instruction() -> None:
    tagger = LogitTagger(tiny_dir("llama"), loaded("llama").schema, SETTINGS).load()
    rows = item_rows(catalog_split(8).items, ["Animation", "Children's", "Horror"], 0, 8)
    known = {1: ["Horror"], 2: ["Animation", "Children's"]}
    before = len(tagger.layout.instruction)
    tag_items(tagger, rows, known, batch_size=4, shots=5, progress=False)
    text = tagger.tok.decode(tagger.layout.instruction)
    assert f"Movie: «{rows[1]['title']}»\nGenre: Horror\n" in text
    assert f"Movie: «{rows[2]['title']}»\nGenre: Animation, Children's\n" in text
    assert all(rows[i]["title"] not in text for i in (0, 3, 4, 5, 6, 7))  # unknown rows are never shown
    assert tagger.instruction is not None and tagger.instruction.length == len(tagger.layout.instruction) > before


def test_bad_requests_fail_with_a_clear_message(tmp_path: Path) -> None:
    split = catalog_split(4)
    with pytest.raises(ValueError, match="method must be 'generate' or 'logits'"):
        tag_catalog(split, str(tiny_model_dir()), tmp_path, SETTINGS,
                    TagOptions(method="bogus", progress=False))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="local engine only"):
        tag_catalog(split, str(tiny_model_dir()), tmp_path, SETTINGS,
                    TagOptions(method="logits", engine="ray", progress=False))
    schema = concrete_schema(["A", "B"])
    schema["properties"]["score"] = {"type": "number"}
    with pytest.raises(ValueError, match="'score' is neither closed"):
        LogitTagger(str(tiny_model_dir()), schema, SETTINGS)


def test_cli_names_a_bad_method() -> None:
    from cli.main import app

    result = CliRunner().invoke(app, ["tag", "--method", "regex"])
    assert result.exit_code == 2
    assert "'--method'" in result.output and "'regex' is not one of 'generate', 'logits'" in result.output


@pytest.mark.slow
@pytest.mark.skipif(not (CONVERTED / "config.json").exists(), reason=f"converted SmolLM2 not found at {CONVERTED}")
def test_real_smollm2_tags_movies_with_schema_valid_documents(tmp_path: Path) -> None:
    """The real backbone and tokenizer: multi-token genres are read whole, every document validates."""
    split = catalog_split(6)
    summary = tag_catalog(split, str(CONVERTED), tmp_path, TaggerSettings(precision="fp32", max_new_tokens=24,
                          threads=2), TagOptions(method="logits", chunk_size=6, batch_size=3, progress=False))
    assert summary["schema_valid_rate"] == 1.0 and summary["items"] == 6
    tags = load_tags(tmp_path / "tags")[0]
    schema = concrete_schema(catalog_categories(split.items["categories"]))
    assert all(validation_errors(json.loads(raw), schema) == [] for raw in tags["raw"])
    assert all(1 <= len(s) <= 60 for s in tags["summary"])
