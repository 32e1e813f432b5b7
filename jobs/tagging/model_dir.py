"""The tagging model's directory: cheap checks before the job starts, and a load that fails in one line.

``check_model_dir`` refuses a local Hugging Face directory that cannot load, naming the file and
what is wrong, before the job reads or writes a part: no ``config.json`` or one that is not a
JSON object, no weights, a ``model.safetensors`` shorter than its header says (an interrupted
download or copy) or with an unreadable header, a shard index without a ``weight_map`` or naming
a shard that is not there, a ``pytorch_model.bin`` that is no PyTorch checkpoint. It reads
headers only. ``load_or_refuse`` is the full check: it loads the model, and whatever the loader
raises (safetensors, transformers and torch raise their own types, ``KeyError`` among them)
becomes one ``ValueError`` naming the directory, raised before any part is changed.

Deliberately left out: hub ids and other non-local locations (left to the loader), checksums of
the weights (``llm_rerank.backbone.weights_digest`` versions them; it does not validate them).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
_MAX_HEADER = 100 * 1024 * 1024  # safetensors caps its JSON header at 100 MB


def check_model_dir(model_dir: str) -> None:
    """Refuse a local model directory that cannot load (see the module docstring) before the job
    writes anything; another location is left to the loader."""
    path = Path(model_dir)
    if not path.is_dir():
        return
    config = path / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"{path}: no config.json there (not a Hugging Face model directory)")
    parsed = _json_file(config)
    if not isinstance(parsed, dict):
        raise ValueError(f"{config}: not a JSON object (a Hugging Face model config)")
    present = [path / name for name in WEIGHT_FILES if (path / name).is_file()]
    if not present:
        raise FileNotFoundError(f"{path}: no model weights there ({', '.join(WEIGHT_FILES)})")
    weights = present[0]  # the loader's order of preference
    if weights.name == "model.safetensors":
        check_safetensors(weights)
    elif weights.name.endswith(".index.json"):
        _check_index(weights)
    else:
        _check_torch_checkpoint(weights)


def check_safetensors(path: Path) -> None:
    """A ValueError naming ``path`` when its header cannot be read or the file is shorter than the
    tensors its header lists (truncated)."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        head = fh.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if not 0 < n <= _MAX_HEADER or 8 + n > size:
            raise ValueError(f"{path}: not a whole safetensors file ({size:,} bytes; its header cannot be read: "
                             "an interrupted download or copy?)")
        try:
            header = json.loads(fh.read(n))
        except (UnicodeDecodeError, ValueError) as exc:
            raise ValueError(f"{path}: its safetensors header is not JSON ({exc})") from exc
    if not isinstance(header, dict):
        raise ValueError(f"{path}: its safetensors header is not a JSON object")
    ends = []
    for name, tensor in header.items():
        offsets = tensor.get("data_offsets", [0, 0]) if isinstance(tensor, dict) and name != "__metadata__" else [0, 0]
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)):
            raise ValueError(f"{path}: tensor {name!r} in its safetensors header has data_offsets {offsets!r}, "
                             "not two byte offsets")
        ends.append(offsets[1])
    expected = 8 + n + max(ends, default=0)
    if size < expected:
        raise ValueError(f"{path}: {size:,} bytes, but its header lists tensors up to byte {expected:,} (truncated: "
                         "an interrupted download or copy?)")


def _check_index(path: Path) -> None:
    """A ValueError naming the shard index ``path`` when it has no ``weight_map`` of file names, or
    names a shard that is not beside it."""
    index = _json_file(path)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map or not all(isinstance(v, str) for v in weight_map.values()):
        raise ValueError(f"{path}: not a shard index (no 'weight_map' object of tensor -> file name)")
    missing = sorted({v for v in weight_map.values() if not (path.parent / v).is_file()})
    if missing:
        raise FileNotFoundError(f"{path}: the shard(s) {', '.join(missing)} it names are not in {path.parent}")
    for shard in sorted({path.parent / v for v in weight_map.values() if v.endswith(".safetensors")}):
        check_safetensors(shard)


def _check_torch_checkpoint(path: Path) -> None:
    """A ValueError naming ``path`` unless it starts like a PyTorch checkpoint (a zip archive, or a
    legacy pickle)."""
    with path.open("rb") as fh:
        head = fh.read(4)
    if not (head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"):
        raise ValueError(f"{path}: not a PyTorch checkpoint (it starts with {head!r}, neither a zip archive nor a "
                         "pickle)")


def _json_file(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from exc


def load_or_refuse(tagger: Any, model_dir: str) -> Any:
    """``tagger.load()``; any failure (the loaders raise their own exception types) as one ValueError
    naming ``model_dir``, raised before the job changes a part."""
    try:
        return tagger.load()
    except Exception as exc:  # noqa: BLE001 - safetensors, transformers and torch raise types of their own
        raise ValueError(f"{model_dir}: the tagging model cannot be loaded ({type(exc).__name__}: "
                         f"{' '.join(str(exc).split())}); no part was changed") from exc
